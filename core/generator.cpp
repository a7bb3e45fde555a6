#include "core/generator.h"

namespace mixprec {

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

}  // namespace mixprec
