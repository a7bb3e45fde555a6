#!/usr/bin/env python3
"""Reads a folder of TensorBoard event files with TensorBoard's own reader and prints JSON.

    read_tensorboard.py [--served] LOGDIR            # the JSON below
    read_tensorboard.py [--served] --summary LOGDIR  # a table: per file its records and how
                                                     # it ends, per tag the points shown

Needs PyPI's `tensorboard` (scripts/setup_tests.sh installs it into a venv). Prints one JSON
object:

- "tensorboard": the version of the reader;
- "files": per event file in name order (the order TensorBoard reads them in): "name",
  "records" (complete records), "end" ("clean": the last record ends at the end of the file;
  "truncated": the file ends inside a record; "crc": a length or data checksum is wrong),
  "file_version", "session_starts" (steps of SessionLog START events) and "scalars"
  ({tag: [[step, value], ...]} in file order), read with EventFileLoader, which stops at the
  first record it cannot read and hands scalars over as the scalars plugin's data, as
  TensorBoard does;
- "scalars": {tag: [[step, value], ...]} as TensorBoard shows the run, from EventAccumulator
  over the whole folder (every point kept; a later SessionLog START drops the points earlier
  files wrote at or after its step);
- "histograms": {tag: [{"step", "min", "max", "num", "sum", "sum_squares", "bucket_limit",
  "bucket"}, ...]} from the same accumulator;
- with --served, "served": {tag: [[step, value], ...]} as a running `tensorboard --logdir
  LOGDIR --load_fast=true` serves the scalars over HTTP: the default loader, TensorBoard's
  Rust data server, which reads the files itself (and ignores SessionLog); null when it
  could not be started (no data server for this platform).
"""

import json
import os
import sys


def record_integrity(path, errors, reader_class):
    """Counts the complete records of `path` and says how the file ends."""
    reader = reader_class(path)
    records = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return records, "clean"
        except errors.DataLossError as error:
            return records, "truncated" if "truncated" in str(error) else "crc"
        records += 1


def http_json(port, path):
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as reply:
        return json.load(reply)


def served_scalars(logdir):
    """The scalars of LOGDIR's single run as TensorBoard's data server serves them, once two
    polls half a second apart agree; None when the server does not come up in 60 s."""
    import socket
    import subprocess
    import time
    import urllib.parse

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
         "--port", str(port), "--load_fast", "true", "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        previous = None
        while time.time() < deadline and server.poll() is None:
            time.sleep(0.5)
            try:
                runs = http_json(port, "/data/plugin/scalars/tags")
                scalars = {}
                for run, tags in runs.items():
                    for tag in tags:
                        query = urllib.parse.urlencode({"run": run, "tag": tag})
                        points = http_json(port, "/data/plugin/scalars/scalars?" + query)
                        scalars[tag] = [[step, value] for _, step, value in points]
            except OSError:
                continue
            if scalars and scalars == previous:
                return scalars
            previous = scalars
        return None
    finally:
        server.terminate()
        server.wait()


def print_summary(read):
    """The JSON of main() as a few lines of text."""
    print("tensorboard %s" % read["tensorboard"])
    for f in read["files"]:
        print("%s: %d records, %s end, %s, START at %s" % (
            f["name"], f["records"], f["end"], f["file_version"],
            ", ".join(str(s) for s in f["session_starts"]) or "-"))
    for kind in ("scalars", "histograms", "served"):
        if read.get(kind) is None:
            continue
        if kind == "served":
            print("served by tensorboard --load_fast=true:")
        for tag, points in sorted(read[kind].items()):
            steps = [p["step"] if kind == "histograms" else p[0] for p in points]
            last = ("last %.6g" % points[-1][1]) if kind != "histograms" else (
                "%d buckets" % len(points[-1]["bucket"]))
            print("%-34s %4d points, steps %d..%d, %s" % (
                tag, len(points), min(steps), max(steps), last))


def main():
    args = sys.argv[1:]
    served = "--served" in args
    summary = "--summary" in args
    args = [a for a in args if a not in ("--served", "--summary")]
    if len(args) != 1:
        sys.exit("usage: read_tensorboard.py [--served] [--summary] LOGDIR")
    logdir = args[0]

    import tensorboard
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
    from tensorboard.util import tensor_util

    names = sorted(n for n in os.listdir(logdir) if "tfevents" in n)
    files = []
    for name in names:
        path = os.path.join(logdir, name)
        records, end = record_integrity(path, errors, PyRecordReader_New)
        entry = {"name": name, "records": records, "end": end, "file_version": None,
                 "session_starts": [], "scalars": {}}
        for event in EventFileLoader(path).Load():
            if event.HasField("file_version"):
                entry["file_version"] = event.file_version
            elif event.HasField("session_log"):
                if event.session_log.status == event_pb2.SessionLog.START:
                    entry["session_starts"].append(event.step)
            elif event.HasField("summary"):
                for value in event.summary.value:
                    # EventFileLoader hands scalars over as the scalars plugin's tensors.
                    if value.metadata.plugin_data.plugin_name == "scalars":
                        entry["scalars"].setdefault(value.tag, []).append(
                            [event.step, tensor_util.make_ndarray(value.tensor).item()])
        files.append(entry)

    accumulator = event_accumulator.EventAccumulator(
        logdir, size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE,
        purge_orphaned_data=True)
    accumulator.Reload()
    tags = accumulator.Tags()
    scalars = {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
               for tag in tags["scalars"]}
    histograms = {}
    for tag in tags["histograms"]:
        histograms[tag] = [
            {"step": e.step, "min": e.histogram_value.min, "max": e.histogram_value.max,
             "num": e.histogram_value.num, "sum": e.histogram_value.sum,
             "sum_squares": e.histogram_value.sum_squares,
             "bucket_limit": list(e.histogram_value.bucket_limit),
             "bucket": list(e.histogram_value.bucket)}
            for e in accumulator.Histograms(tag)]

    read = {"tensorboard": tensorboard.__version__, "files": files, "scalars": scalars,
            "histograms": histograms}
    if served:
        read["served"] = served_scalars(logdir)
    if summary:
        print_summary(read)
        return
    json.dump(read, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
