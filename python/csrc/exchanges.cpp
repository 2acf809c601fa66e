// The exchanges: send, recv and recv from any source; gather, scatter,
// all_to_all_single and all_to_all of lists.
#include "backend.hpp"

#include "backend_parts.hpp"

namespace fastgather_torch {

// Point-to-point: the library's send and recv, beside the collectives
// (fastgather/ops.hpp). Only the two ranks take part, so no sequence number
// is counted (it must be the same on every member of the group).
namespace {
at::Tensor& one_tensor(const char* op, std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "fastgather: ", op, " takes one tensor, got ", tensors.size());
  check_tensor(tensors[0], op, "the tensor");
  return tensors[0];
}
}  // namespace

void ProcessGroupFastgather::check_peer(const char* op, int peer) const {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size_ && peer != rank_, "fastgather: ", op, ": rank ", peer,
                    peer == rank_ ? " is this rank itself" : " is not a rank of the group", " (group of ", size_,
                    ", this rank ", rank_, ")");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const at::Tensor& t = one_tensor("send", tensors);
  check_peer("send", dst);
  auto work = make_work(c10d::OpType::SEND, tensors);
  const at::Tensor buf = t.contiguous();
  work->flight().keep.push_back(buf);
  start(*work, group(), [&](fg::Group& g) { return fg::start_send(g, view_of(buf), dst, tag); });
  work->submitted();
  return work;
}

void ProcessGroupFastgather::add_recv(FastgatherWork& work, const at::Tensor& t, int src, int tag) {
  at::Tensor out = output_buffer(work, t);
  work.flight().keep.push_back(out);
  Flight* f = &work.flight();  // outlives the request (the work's flight holds both)
  start(work, group(), [&](fg::Group& g) { return fg::start_recv(g, view_of(out), src, tag, &f->source); });
  work.submitted();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const at::Tensor& t = one_tensor("recv", tensors);
  check_peer("recv", src);
  auto work = make_work(c10d::OpType::RECV, tensors);
  add_recv(*work, t, src, tag);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const at::Tensor& t = one_tensor("recv (any source)", tensors);
  auto work = make_work(c10d::OpType::RECVANYSOURCE, tensors);
  add_recv(*work, t, fg::kAnySource, tag);
  return work;
}

namespace {

// The library's elements per element of t (complex: two reals).
int64_t per_element(const at::Tensor& t) {
  return static_cast<int64_t>(t.element_size() / fg::dtype_size(library_dtype(t).first));
}

// Elements of t per row of its first dimension.
int64_t row_elements(const at::Tensor& t) {
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  return row;
}

// The parts of t's rows, as torch's split sizes say (none: equal parts), in
// the library's elements.
std::vector<int64_t> counts_of(const char* what, const at::Tensor& t, const std::vector<int64_t>& splits, int n) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  std::vector<int64_t> counts;
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % n == 0, "fastgather: all_to_all_single: the ", what, " has ", rows,
                      " rows, not a multiple of the ", n, " ranks (pass split sizes)");
    counts.assign(static_cast<size_t>(n), rows / n);
  } else {
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == n, "fastgather: all_to_all_single: ", splits.size(), " ",
                      what, " split sizes for ", n, " ranks");
    counts = splits;
  }
  for (int64_t& c : counts) {
    TORCH_CHECK_VALUE(c >= 0 && c <= rows, "fastgather: all_to_all_single: a ", what, " split of ", c, " rows (the ",
                      what, " has ", rows, ")");
    c *= row_elements(t) * per_element(t);
  }
  return counts;
}

// The root's list of a gather (outputs) or scatter (inputs), checked against
// `one` (the input or output every rank passes); none elsewhere, where torch
// passes no list or one empty list.
std::vector<at::Tensor> rooted_list(const char* op, std::vector<std::vector<at::Tensor>>& lists, bool am_root, int size,
                                    const at::Tensor& one, const char* list_word, const char* one_word) {
  if (!am_root) {
    TORCH_CHECK_VALUE(lists.empty() || (lists.size() == 1 && lists[0].empty()), "fastgather: ", op, " takes no ",
                      list_word, " tensors on a rank other than the root");
    return {};
  }
  TORCH_CHECK_VALUE(lists.size() == 1 && static_cast<int>(lists[0].size()) == size, "fastgather: ", op, " needs ", size,
                    " ", list_word, " tensors on the root, got ", lists.empty() ? 0 : lists[0].size());
  const std::string an = std::string("an ") + list_word;
  for (const at::Tensor& t : lists[0]) {
    check_tensor(t, op, an.c_str());
    TORCH_CHECK_TYPE(t.scalar_type() == one.scalar_type(), "fastgather: ", op, ": ", an, " is ", t.scalar_type(),
                     ", the ", one_word, " ", one.scalar_type());
    TORCH_CHECK_VALUE(t.numel() == one.numel(), "fastgather: ", op, ": ", an, " is ", t.sizes(), ", the ", one_word,
                      " ", one.sizes());
  }
  return lists[0];
}

}  // namespace

// The root keeps every rank's input (fg::gather: within a server each input
// is copied into shared memory once and only the root copies them out).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::GatherOptions& opts) {
  constexpr const char* kOp = "gather";
  TORCH_CHECK_VALUE(inputs.size() == 1, "fastgather: gather takes one input, got ", inputs.size());
  check_root(kOp, opts.rootRank);
  const at::Tensor& input = inputs[0];
  check_tensor(input, kOp, "the input");
  const std::vector<at::Tensor> outs = rooted_list(kOp, outputs, opts.rootRank == rank_, size_, input, "output", "input");
  auto work = make_work(c10d::OpType::GATHER, outs);
  const at::Tensor in = input.contiguous();
  work->flight().keep.push_back(in);
  // Straight into the root's outputs (a contiguous copy for one that is not).
  std::vector<fg::TensorView> views;
  for (const at::Tensor& o : outs) views.push_back(view_of(output_buffer(*work, o)));
  const int root = static_cast<int>(opts.rootRank);
  start(*work, group(), [&](fg::Group& g) {
    return fg::start_gather(g, view_of(in), std::span<const fg::TensorView>(views), root);
  });
  return submit(work, opts.asyncOp);
}

// Each rank gets its tensor of the root's list (fg::scatter).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ScatterOptions& opts) {
  constexpr const char* kOp = "scatter";
  TORCH_CHECK_VALUE(outputs.size() == 1, "fastgather: scatter takes one output, got ", outputs.size());
  check_root(kOp, opts.rootRank);
  const at::Tensor& output = outputs[0];
  check_tensor(output, kOp, "the output");
  std::vector<at::Tensor> chunks;
  for (const at::Tensor& in : rooted_list(kOp, inputs, opts.rootRank == rank_, size_, output, "input", "output")) {
    chunks.push_back(in.contiguous());
  }
  auto work = make_work(c10d::OpType::SCATTER, outputs);
  // Straight from the root's inputs (contiguous copies of those that are not).
  std::vector<fg::TensorView> views;
  for (const at::Tensor& c : chunks) {
    work->flight().keep.push_back(c);
    views.push_back(view_of(c));
  }
  const at::Tensor out = output_buffer(*work, output);
  const int root = static_cast<int>(opts.rootRank);
  start(*work, group(), [&](fg::Group& g) {
    return fg::start_scatter(g, std::span<const fg::TensorView>(views), view_of(out), root);
  });
  return submit(work, opts.asyncOp);
}

// all_to_all_single: rows of input to every rank by input_splits (none:
// equal), rows from every rank into output by output_splits (fg::all_to_all).
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                     std::vector<int64_t>& output_splits,
                                                                     std::vector<int64_t>& input_splits,
                                                                     const c10d::AllToAllOptions& opts) {
  constexpr const char* kOp = "all_to_all_single";
  check_tensor(input, kOp, "the input");
  check_tensor(output, kOp, "the output");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "fastgather: ", kOp, ": the output is ",
                   output.scalar_type(), ", the input ", input.scalar_type());
  std::vector<int64_t> send, recv;
  if (!input_splits.empty() || !output_splits.empty()) {
    send = counts_of("input", input, input_splits, size_);
    recv = counts_of("output", output, output_splits, size_);
  } else {
    TORCH_CHECK_VALUE(input.numel() == output.numel() && (input.dim() == 0 ? 1 : input.size(0)) % size_ == 0,
                      "fastgather: ", kOp, ": the input ", input.sizes(), " and the output ", output.sizes(),
                      " must hold as many elements, in rows a multiple of the ", size_, " ranks (or pass split sizes)");
  }
  auto work = make_work(c10d::OpType::ALLTOALL_BASE, {output});
  const at::Tensor in = input.contiguous();
  work->flight().keep.push_back(in);
  const at::Tensor out = output_buffer(*work, output);
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_to_all(g, view_of(in), view_of(out), send, recv); });
  return submit(work, opts.asyncOp);
}

// all_to_all of lists: inputs[j] to rank j, outputs[m] from rank m, of any sizes.
c10::intrusive_ptr<c10d::Work> ProcessGroupFastgather::alltoall(std::vector<at::Tensor>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const c10d::AllToAllOptions& opts) {
  constexpr const char* kOp = "all_to_all";
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                    "fastgather: ", kOp, " needs ", size_, " inputs and outputs (one per rank of the group), got ",
                    inputs.size(), " and ", outputs.size());
  std::vector<at::Tensor> flat;
  std::vector<int64_t> send, recv;
  for (const at::Tensor& in : inputs) {
    check_tensor(in, kOp, "an input");
    TORCH_CHECK_TYPE(in.scalar_type() == inputs[0].scalar_type(), "fastgather: ", kOp, ": inputs of ",
                     in.scalar_type(), " and ", inputs[0].scalar_type());
    flat.push_back(in.reshape({-1}));
    send.push_back(in.numel() * per_element(in));
  }
  int64_t total = 0;
  for (const at::Tensor& o : outputs) {
    check_tensor(o, kOp, "an output");
    TORCH_CHECK_TYPE(o.scalar_type() == inputs[0].scalar_type(), "fastgather: ", kOp, ": an output is ",
                     o.scalar_type(), ", the inputs ", inputs[0].scalar_type());
    recv.push_back(o.numel() * per_element(o));
    total += o.numel();
  }
  auto work = make_work(c10d::OpType::ALLTOALL, outputs);
  const at::Tensor in = at::cat(flat);
  at::Tensor all = at::empty({total}, outputs[0].options());
  work->flight().keep.push_back(in);
  work->flight().keep.push_back(all);
  int64_t offset = 0;
  for (const at::Tensor& o : outputs) {
    chain_copy(*work, o, all.narrow(0, offset, o.numel()).view_as(o));
    offset += o.numel();
  }
  start(*work, group(), [&](fg::Group& g) { return fg::start_all_to_all(g, view_of(in), view_of(all), send, recv); });
  return submit(work, opts.asyncOp);
}

}  // namespace fastgather_torch
