// FlashMLA's sparse decode op called from C++: the [T, 1, ...] views FlashMLA takes and returns are made here,
// so a bound call costs one Python-to-C++ call instead of that call plus five Python view calls
// (dsv4hal/kernels/native_glue.py builds this file at first use; flashmla_glue.py calls it).
//
// The op is found by name in the dispatcher and called boxed, so this file names no vendor header or symbol:
// the Python side has checked the op's schema (flashmla_glue.DECODE_OP_ARGS) before binding it here.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <tuple>

namespace {

using OptTensor = std::optional<at::Tensor>;

class DecodeCall {
 public:
  DecodeCall(const std::string& name, const std::string& overload)
      : op_(c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str())) {}

  // (out [T, h_q, d_v], lse [T, h_q], scheduler metadata, splits): the op's outputs with s_q = 1 squeezed away.
  std::tuple<at::Tensor, at::Tensor, OptTensor, OptTensor> operator()(
      const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, const at::Tensor& lengths,
      const at::Tensor& sink, const OptTensor& metadata, const OptTensor& splits, const OptTensor& extra_kv,
      const OptTensor& extra_indices, const OptTensor& extra_lengths, int64_t d_v, double scale) const {
    // Without a plan the op plans from the lengths: its scheduler asserts (ending the CUDA context) and its decode
    // reads past the index rows on a length outside [0, width], so they are clamped on the device first (a plan
    // from dsv4hal comes with the lengths it was made for, already clamped: flashmla_glue.within_widths).
    const bool clamp = !metadata.has_value();
    OptTensor xlengths = extra_lengths;
    if (clamp && extra_lengths && extra_indices) {
      xlengths = extra_lengths->clamp(0, extra_indices->size(-1));
    }
    torch::jit::Stack stack;
    stack.reserve(13);
    stack.emplace_back(q.unsqueeze(1));
    stack.emplace_back(kv);
    stack.emplace_back(indices.unsqueeze(1));
    stack.emplace_back(clamp ? lengths.clamp(0, indices.size(-1)) : lengths);
    stack.emplace_back(sink);
    stack.emplace_back(metadata);
    stack.emplace_back(splits);
    stack.emplace_back(extra_kv);
    stack.emplace_back(extra_indices ? OptTensor(extra_indices->unsqueeze(1)) : OptTensor());
    stack.emplace_back(xlengths);
    stack.emplace_back(d_v);
    stack.emplace_back(scale);
    stack.emplace_back();  // kv_format: None, as the Python entry passes for the V4 format
    op_.callBoxed(&stack);
    return {stack[0].toTensor().squeeze(1), stack[1].toTensor().squeeze(2), optional_tensor(stack[2]),
            optional_tensor(stack[3])};
  }

 private:
  static OptTensor optional_tensor(const c10::IValue& v) { return v.isNone() ? OptTensor() : OptTensor(v.toTensor()); }

  c10::OperatorHandle op_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<DecodeCall>(m, "DecodeCall")
      .def(pybind11::init<const std::string&, const std::string&>())
      .def("__call__", &DecodeCall::operator());
}
