// activation.cuh — the activation switch shared by the kernels that fuse one into their output
// (conv.cu, epilogue.cu). Included textually: the runtime and compile_check.py replace the
// `#include "activation.cuh"` line with this file before NVRTC sees the source.
//
// Activations (act): 0 none, 1 relu, 2 relu6, 3 leaky relu (alpha), 4 sigmoid, 5 gelu (erf form),
//   6 silu, 7 tanh, 8 hard swish, 9 clip [alpha, beta]; anything else gives NaN.

static __device__ __forceinline__ float activate(float x, int act, float alpha, float beta) {
    switch (act) {
    case 0: return x;
    case 1: return fmaxf(x, 0.0f);
    case 2: return fminf(fmaxf(x, 0.0f), 6.0f);
    case 3: return x >= 0.0f ? x : alpha * x;
    case 4: return 1.0f / (1.0f + expf(-x));
    case 5: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case 6: return x / (1.0f + expf(-x));
    case 7: return tanhf(x);
    case 8: return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f);
    case 9: return fminf(fmaxf(x, alpha), beta);
    default: return __int_as_float(0x7fc00000);
    }
}
