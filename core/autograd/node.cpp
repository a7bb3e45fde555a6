#include "core/autograd/node.h"

namespace mixprec {

Node::~Node() {
  std::vector<std::shared_ptr<Node>> orphans;
  auto collect = [&orphans](std::vector<Edge>& edges) {
    for (Edge& edge : edges)
      if (edge.node && edge.node.use_count() == 1) orphans.push_back(std::move(edge.node));
  };
  collect(next_edges);
  while (!orphans.empty()) {
    std::shared_ptr<Node> node = std::move(orphans.back());
    orphans.pop_back();
    collect(node->next_edges);
  }
}

void Node::release() {
  if (keeps_graph()) return;
  release_saved();
  saved_versions.clear();
  released = true;
}

}  // namespace mixprec
