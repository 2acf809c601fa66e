#include "plot.hpp"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>

#include <fmt/format.h>

namespace fastgather::bench {

Status plot(const std::vector<Row>& rows, const std::string& png, const std::string& title) {
  std::map<std::string, std::vector<const Row*>> series;  // "op impl" -> rows by size
  std::vector<const Row*> limit;
  for (const Row& r : rows) {
    series[r.op + " " + r.impl].push_back(&r);
    if (r.op == "all_gather" && r.impl == "fastgather" && r.limit_us > 0) limit.push_back(&r);
  }
  const std::string data = png + ".dat";
  {
    std::ofstream f(data);
    for (auto& [name, rs] : series) {  // one gnuplot data block per series
      f << "# " << name << "\n";
      for (const Row* r : rs) f << r->bytes_per_rank << " " << r->lat.median << " " << r->algbw_gbs << "\n";
      f << "\n\n";
    }
    f << "# limit\n";
    for (const Row* r : limit) {
      f << r->bytes_per_rank << " " << r->limit_us << " "
        << (r->limit_us > 0 ? static_cast<double>(r->bytes_per_rank) * r->group_size / (r->limit_us * 1e3) : 0) << "\n";
    }
    f << "\n\n";
    if (!f) return {ErrorKind::kSystem, "cannot write " + data};
  }
  std::string svg = png;
  if (auto dot = svg.rfind('.'); dot != std::string::npos) svg.resize(dot);
  svg += ".svg";

  std::string plots_lat, plots_bw;
  int idx = 0;
  for (auto& [name, rs] : series) {
    plots_lat += fmt::format("'{}' index {} using 1:2 with linespoints title '{}', ", data, idx, name);
    plots_bw += fmt::format("'{}' index {} using 1:3 with linespoints title '{}', ", data, idx, name);
    ++idx;
  }
  plots_lat += fmt::format("'{}' index {} using 1:2 with lines dashtype 2 lw 2 title 'limit (all_gather)'", data, idx);
  plots_bw += fmt::format("'{}' index {} using 1:3 with lines dashtype 2 lw 2 title 'limit (all_gather)'", data, idx);

  std::string script;
  for (const auto& [term, out] : {std::pair{"pngcairo size 1400,600", png}, std::pair{"svg size 1400,600", svg}}) {
    script += fmt::format(
        "set terminal {}\nset termoption noenhanced\nset output '{}'\nset multiplot layout 1,2 title '{}'\n"
        "set logscale xy\nset grid\nset key left top\nset xlabel 'bytes per rank'\nset ylabel 'median latency (us)'\n"
        "plot {}\nset ylabel 'algbw (GB/s)'\nunset logscale y\nset key left top\nplot {}\nunset multiplot\n",
        term, out, title, plots_lat, plots_bw);
  }
  FILE* gp = ::popen("gnuplot 2>&1", "w");
  if (gp == nullptr) return {ErrorKind::kUnsupported, "gnuplot not found (apt-get install gnuplot-nox)"};
  std::fputs(script.c_str(), gp);
  int rc = ::pclose(gp);
  if (rc != 0) return {ErrorKind::kSystem, fmt::format("gnuplot exited with status {}", rc)};
  return Status::Ok();
}

}  // namespace fastgather::bench
