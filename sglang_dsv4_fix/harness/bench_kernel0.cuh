// sglang-dsv4-fix harness: times plan_compress_prefill_kernel0 alone (no kernel_1, no allocation).
// Included AFTER the tree's own c_plan.cuh, so Prefill0Params, kMaxPrefillBatchSize and the
// kernel are the tree's. `launches` back-to-back launches are captured into one CUDA graph on a
// private stream; each replay is timed with CUDA events; out_ms (CPU float64, [replays]) gets
// the milliseconds of each replay.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace sglang_dsv4_fix_harness {

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << what << ": " << cudaGetErrorString(err);
  }
}

inline void bench_kernel0(
    tvm::ffi::TensorView plan_c,       // GPU u8 [N, 16]
    tvm::ffi::TensorView plan_w,       // GPU u8 [N, 8]
    tvm::ffi::TensorView seq_lens,     // GPU i64 [B]
    tvm::ffi::TensorView extend_lens,  // GPU i64 [B]
    int32_t compress_ratio,
    int32_t swa_page_size,
    int32_t mtp_pad,
    int64_t launches,
    tvm::ffi::TensorView out_ms) {  // CPU f64 [replays]
  const auto params = Prefill0Params{
      .plan_c = static_cast<PlanC*>(plan_c.data_ptr()),
      .plan_w = static_cast<PlanW*>(plan_w.data_ptr()),
      .seq_lens_ptr = static_cast<const IDX_T*>(seq_lens.data_ptr()),
      .extend_lens_ptr = static_cast<const IDX_T*>(extend_lens.data_ptr()),
      .batch_size = static_cast<uint32_t>(seq_lens.size(0)),
      .num_q_tokens = static_cast<uint32_t>(plan_w.size(0)),
      .compress_ratio = compress_ratio,
      .swa_page_size = swa_page_size,
      .mtp_pad = mtp_pad,
  };
  check(cudaSetDevice(plan_c.device().device_id), "cudaSetDevice");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int64_t i = 0; i < launches; ++i) {
    plan_compress_prefill_kernel0<<<1, kMaxPrefillBatchSize, 0, stream>>>(params);
  }
  check(cudaGetLastError(), "launch kernel0");
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate graph");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  check(cudaGraphLaunch(exec, stream), "warm-up replay");
  check(cudaStreamSynchronize(stream), "warm-up sync");
  auto* out = static_cast<double*>(out_ms.data_ptr());
  for (int64_t r = 0; r < out_ms.size(0); ++r) {
    check(cudaEventRecord(start, stream), "record");
    check(cudaGraphLaunch(exec, stream), "replay");
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    out[r] = ms;
  }
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  check(cudaGraphExecDestroy(exec), "graph");
  check(cudaGraphDestroy(graph), "graph");
  check(cudaStreamDestroy(stream), "stream");
}

}  // namespace sglang_dsv4_fix_harness

TVM_FFI_DLL_EXPORT_TYPED_FUNC(bench_kernel0, sglang_dsv4_fix_harness::bench_kernel0);
