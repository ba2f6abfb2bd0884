// epilogue.cu — fp32 bias + activation epilogues for conv and GEMM outputs, applied in place.
//
// The output y holds n elements, row-major; element i belongs to channel (i / inner) % channels:
//   NCHW conv output: channels = C, inner = H*W;   GEMM output [M, N] with a per-column bias:
//   channels = N, inner = 1;   per-row bias [M, N]: channels = M, inner = N.
// Activations (act): the codes of activation.cuh.
//
// epilogue_bias_act_f32(y, bias, n, channels, inner, act, alpha, beta)
//     y[i] = act(y[i] + bias[c]); bias may be NULL (activation only).
// epilogue_bias_residual_act_f32(y, bias, residual, n, channels, inner, act, alpha, beta)
//     y[i] = act(y[i] + bias[c] + residual[i]) — a conv/GEMM followed by a skip connection;
//     bias may be NULL; residual has y's shape and layout.
// epilogue_scale_shift_act_f32(y, scale, shift, n, channels, inner, act, alpha, beta)
//     y[i] = act(y[i] * scale[c] + shift[c]) — inference batch norm folded to a per-channel affine;
//     scale or shift may be NULL (1 and 0).
//
// Launch shape (all three): 1-D grid-stride loops, e.g. blockDim.x = 256,
// gridDim.x = min(ceil(n / 256), 65535).

#include "activation.cuh"

static __device__ __forceinline__ int channel_of(long long i, int channels, long long inner) {
    return (int)((i / inner) % channels);
}

extern "C" __global__ void epilogue_bias_act_f32(float* __restrict__ y, const float* __restrict__ bias, long long n,
                                                 int channels, long long inner, int act, float alpha, float beta) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = y[i];
        if (bias) v += bias[channel_of(i, channels, inner)];
        y[i] = activate(v, act, alpha, beta);
    }
}

extern "C" __global__ void epilogue_bias_residual_act_f32(float* __restrict__ y, const float* __restrict__ bias,
                                                          const float* __restrict__ residual, long long n,
                                                          int channels, long long inner, int act, float alpha,
                                                          float beta) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = y[i];
        if (bias) v += bias[channel_of(i, channels, inner)];
        v += residual[i];
        y[i] = activate(v, act, alpha, beta);
    }
}

extern "C" __global__ void epilogue_scale_shift_act_f32(float* __restrict__ y, const float* __restrict__ scale,
                                                        const float* __restrict__ shift, long long n, int channels,
                                                        long long inner, int act, float alpha, float beta) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        int c = channel_of(i, channels, inner);
        float v = y[i];
        if (scale) v *= scale[c];
        if (shift) v += shift[c];
        y[i] = activate(v, act, alpha, beta);
    }
}
