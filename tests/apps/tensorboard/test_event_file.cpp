// The layers of an event file: CRC-32C against published vectors, the TFRecord framing and the
// Event encoding against bytes TensorBoard's own Python classes produce, and the writer's
// files read back record by record.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "apps/tensorboard/crc32c.h"
#include "apps/tensorboard/event_file.h"
#include "apps/tensorboard/tfrecord.h"
#include "core/error.h"
#include "tests/apps/tensorboard/event_records.h"
#include "tests/scratch_dir.h"

using namespace mixprec::tensorboard;
using namespace tensorboard_test;
using mixprec_test::ScratchDir;

namespace fs = std::filesystem;

namespace {

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

std::string event_files_in(const std::string& dir) {
  std::string found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0) found += (found.empty() ? "" : ",") + name;
  }
  return found;
}

}  // namespace

TEST_CASE("tensorboard: crc32c matches the published CRC-32C vectors", "[tensorboard]") {
  // "123456789" is the check value of the CRC catalogue; the 32-byte ones are RFC 3720's
  // (iSCSI) appendix B.4.
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  CHECK(crc32c(ascending) == 0x46DD794Eu);
  CHECK(crc32c(descending) == 0x113FDB5Cu);
}

TEST_CASE("tensorboard: the masked crc and the record framing are TensorBoard's", "[tensorboard]") {
  // Expected values from tensorboard's pywrap_tensorflow.masked_crc32c and RecordWriter.
  CHECK(masked_crc32c("123456789") == 0xC78AB0E5u);
  CHECK(masked_crc32c("") == 0xA282EAD8u);
  CHECK(masked_crc32c(std::string(32, '\0')) == 0x0FD7FFFAu);
  CHECK(tfrecord_frame("hello") == from_hex("0500000000000000eab2043e68656c6c6fbb1f1c19"));
  const std::string empty = tfrecord_frame("");
  CHECK(empty.size() == 16);
  CHECK(empty.substr(0, 8) == std::string(8, '\0'));
}

TEST_CASE("tensorboard: events encode to the bytes of TensorBoard's own classes", "[tensorboard]") {
  // Each hex string is tensorboard.compat.proto.event_pb2.Event(...).SerializeToString() of
  // the same event, so a wrong field number or wire type shows here.
  Event scalar;
  scalar.set_wall_time(1.5);
  scalar.set_step(7);
  Summary::Value* value = scalar.mutable_summary()->add_value();
  value->set_tag("loss/train");
  value->set_simple_value(0.25f);
  CHECK(scalar.SerializeAsString() ==
        from_hex("09000000000000f83f10072a130a110a0a6c6f73732f747261696e150000803e"));

  Event start;
  start.set_wall_time(1.5);
  start.set_step(3);
  start.mutable_session_log()->set_status(SessionLog::START);
  CHECK(start.SerializeAsString() == from_hex("09000000000000f83f10033a020801"));

  Event version;
  version.set_wall_time(1.5);
  version.set_file_version("brain.Event:2");
  CHECK(version.SerializeAsString() ==
        from_hex("09000000000000f83f1a0d627261696e2e4576656e743a32"));

  Event histogram;
  histogram.set_wall_time(1.5);
  histogram.set_step(2);
  Summary::Value* h = histogram.mutable_summary()->add_value();
  h->set_tag("h");
  HistogramProto* histo = h->mutable_histo();
  histo->set_min(-3);
  histo->set_max(-1);
  histo->set_num(5);
  histo->set_sum(-9);
  histo->set_sum_squares(17);
  histo->add_bucket_limit(-2);
  histo->add_bucket_limit(-1);
  histo->add_bucket(2);
  histo->add_bucket(3);
  CHECK(histogram.SerializeAsString() ==
        from_hex("09000000000000f83f10022a580a560a01682a510900000000000008c011000000000000f0bf19"
                 "00000000000014402100000000000022c0290000000000003140321000000000000000c000000000"
                 "0000f0bf3a1000000000000000400000000000000840"));
}

TEST_CASE("tensorboard: the writer's file reads back record by record", "[tensorboard]") {
  ScratchDir dir("tensorboard-writer");
  const std::string log_dir = dir / "run";
  std::string path;
  {
    EventFileWriter writer(log_dir);  // creates the folder
    path = writer.path();
    writer.write_session_start(1);
    writer.write_scalars(5, {{"loss/train", 2.5}, {"optim/lr", 0.1}});
    writer.write_scalars(6, {});  // nothing to write: no record
    Histogram histogram;
    histogram.min = -3;
    histogram.max = 0;
    histogram.num = 7;
    histogram.limits = {-2, -1, 0};
    histogram.counts = {1, 4, 2};
    writer.write_histograms(9, {{"grad/a", histogram}});
    // Every record is in the file before the writer closes (a live reader sees it).
    const Records live = split_records(read_bytes(path));
    CHECK(live.data.size() == 4);
    CHECK(live.clean_end);
  }
  const std::string name = fs::path(path).filename().string();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.size() > std::string("events.out.tfevents.").size() + 10);
  CHECK(name.substr(name.rfind('.') + 1) == std::to_string(getpid()));

  const Records records = split_records(read_bytes(path));
  CHECK(records.crc_ok);
  CHECK(records.clean_end);
  const std::vector<Event> events = parse_events(records);
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].wall_time() > 1.6e9);
  CHECK(events[1].session_log().status() == SessionLog::START);
  CHECK(events[1].step() == 1);
  CHECK(events[2].step() == 5);
  REQUIRE(events[2].summary().value_size() == 2);
  CHECK(events[2].summary().value(0).tag() == "loss/train");
  CHECK(events[2].summary().value(0).simple_value() == 2.5f);
  CHECK(events[2].summary().value(1).tag() == "optim/lr");
  CHECK(events[2].summary().value(1).simple_value() == 0.1f);
  CHECK(events[2].wall_time() >= events[0].wall_time());
  CHECK(events[3].step() == 9);
  const HistogramProto& histo = events[3].summary().value(0).histo();
  CHECK(events[3].summary().value(0).tag() == "grad/a");
  CHECK(histo.min() == -3);
  CHECK(histo.max() == 0);
  CHECK(histo.num() == 7);
  CHECK(std::vector<double>(histo.bucket_limit().begin(), histo.bucket_limit().end()) ==
        std::vector<double>{-2, -1, 0});
  CHECK(std::vector<double>(histo.bucket().begin(), histo.bucket().end()) ==
        std::vector<double>{1, 4, 2});
}

TEST_CASE("tensorboard: a file cut mid-record keeps every record before the cut",
          "[tensorboard]") {
  ScratchDir dir("tensorboard-cut");
  std::string path;
  {
    EventFileWriter writer(dir / "run");
    path = writer.path();
    for (int step = 1; step <= 3; ++step) writer.write_scalars(step, {{"loss/train", step * 1.0}});
  }
  const std::string bytes = read_bytes(path);
  const size_t last = tfrecord_frame(split_records(bytes).data.back()).size();
  for (const size_t cut : {size_t{1}, size_t{4}, last - 12, last - 1}) {
    INFO("cut " << cut << " bytes off the end");
    const Records records = split_records(bytes.substr(0, bytes.size() - cut));
    CHECK(records.crc_ok);
    CHECK_FALSE(records.clean_end);
    const std::vector<Event> events = parse_events(records);
    REQUIRE(events.size() == 3);  // the version and steps 1 and 2
    CHECK(events[2].step() == 2);
  }
  // A flipped byte in a record's data fails its CRC.
  std::string flipped = bytes;
  flipped[flipped.size() - 6] ^= 0x01;
  CHECK_FALSE(split_records(flipped).crc_ok);
}

TEST_CASE("tensorboard: a new event file sorts after the files already in its folder",
          "[tensorboard]") {
  ScratchDir dir("tensorboard-names");
  const std::string folder = dir / "run";
  fs::create_directories(folder);
  const std::string first = event_file_name(folder, 1700000000);
  CHECK(first.rfind("events.out.tfevents.1700000000.", 0) == 0);
  std::ofstream(folder + "/" + first) << "";
  // Made in the same second, or with a clock that went back: one second after the newest.
  CHECK(event_file_name(folder, 1700000000).rfind("events.out.tfevents.1700000001.", 0) == 0);
  CHECK(event_file_name(folder, 1600000000).rfind("events.out.tfevents.1700000001.", 0) == 0);
  // Later: its own time. Seconds are ten digits, so names sort as times do.
  CHECK(event_file_name(folder, 1700000050).rfind("events.out.tfevents.1700000050.", 0) == 0);
  CHECK(event_file_name(dir / "missing", 5).rfind("events.out.tfevents.0000000005.", 0) == 0);

  // Two writers at once in one folder: two files, the second after the first.
  EventFileWriter a(folder);
  EventFileWriter b(folder);
  CHECK(a.path() != b.path());
  CHECK(a.path() < b.path());
  INFO(event_files_in(folder));
  CHECK(fs::path(a.path()).filename().string() > first);
}

TEST_CASE("tensorboard: a folder that cannot be made is an error naming it", "[tensorboard]") {
  ScratchDir dir("tensorboard-bad");
  std::ofstream(dir / "file") << "x";
  CHECK_THROWS_WITH(EventFileWriter(dir / "file"), Catch::Contains(dir / "file"));
}
