// Charts as PNG files through gnuplot, the way bench and inspect draw theirs.
//
// The caller writes the data files; render_chart() writes the gnuplot script that plots them
// next to them and runs `gnuplot <script>` in that folder when gnuplot is on the PATH. When it
// is not (or it fails), the data and the script stay, and the result's message says how to
// render the chart later, so a machine without gnuplot loses nothing but the picture.
#pragma once

#include <string>

namespace mixprec {

struct ChartResult {
  std::string script_path;  // always written
  std::string png_path;     // the PNG the script draws
  bool rendered = false;    // the PNG exists now
  std::string message;      // one line: what was written, or why not and the command to run
};

// True when a `gnuplot` executable is on the PATH.
bool gnuplot_available();

// Writes `script` to <folder>/<stem>.gp, prefixed by the terminal settings ("pngcairo" when
// gnuplot has it, else "png", width x height pixels) and `set output '<stem>.png'`, and runs
// gnuplot in `folder`, so the script names its data files relative to `folder`. Throws
// mixprec::Error when the script cannot be written; a gnuplot that is missing or fails is
// reported in the result, not thrown (its stderr's first line is quoted).
ChartResult render_chart(const std::string& folder, const std::string& stem,
                         const std::string& script, int width = 900, int height = 560);

// Quotes `text` for a gnuplot string literal in single quotes ('it''s').
std::string gnuplot_quote(const std::string& text);

}  // namespace mixprec
