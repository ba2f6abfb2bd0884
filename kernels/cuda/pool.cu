// pool.cu — fp32 NCHW pooling. x is [N, C, H, W] seen as NC = N*C planes of H*W; y is [NC, OH, OW].
// The host computes OH/OW, ceil mode included: OH = floor_or_ceil((H + pad_top + pad_bottom -
// dil_h*(KH-1) - 1) / stride_h) + 1 (in ceil mode dropping a last window that would start inside the
// bottom padding, as ONNX and PyTorch do). Windows are clipped to the input here, so a ceil-mode
// window running past the padded edge reads only what exists.
//
// maxpool2d_nchw_f32(x, y, NC, H, W, OH, OW, KH, KW, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w)
//     y = max over the window taps inside the image (fmaxf: NaN inputs are skipped). A window with no
//     tap inside the image gives -inf.
// avgpool2d_nchw_f32(x, y, NC, H, W, OH, OW, KH, KW, stride_h, stride_w, pad_top, pad_left, pad_bottom,
//                    pad_right, dil_h, dil_w, count_include_pad)
//     y = sum over taps inside the image / divisor; the divisor counts the taps inside the image
//     (count_include_pad = 0) or the taps inside the padded image [-pad_top, H + pad_bottom) x
//     [-pad_left, W + pad_right) (count_include_pad = 1; ceil-mode overhang beyond the padding is not
//     counted, as PyTorch does). A window with divisor 0 gives 0.
//     Launch shape (both): 1-D grid-stride over NC*OH*OW outputs, e.g. blockDim.x = 256,
//     gridDim.x = min(ceil(NC*OH*OW / 256), 65535).
// global_avgpool_nchw_f32(x, y, NC, HW) / global_maxpool_nchw_f32(x, y, NC, HW)
//     y[p] = mean (max) of plane p's HW values. One block per plane (blocks stride over planes, any
//     gridDim.x <= NC, e.g. min(NC, 65535)); blockDim.x a multiple of 32, at most 1024 (e.g. 256);
//     warp-shuffle + static shared-memory (33 floats) block reduction.

extern "C" __global__ void maxpool2d_nchw_f32(const float* __restrict__ x, float* __restrict__ y, long long NC, int H,
                                              int W, int OH, int OW, int KH, int KW, int stride_h, int stride_w,
                                              int pad_top, int pad_left, int dil_h, int dil_w) {
    const long long total = NC * OH * OW;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int ow = (int)(i % OW);
        const int oh = (int)((i / OW) % OH);
        const long long p = i / ((long long)OW * OH);
        const float* xp = x + p * H * (long long)W;
        const int h0 = oh * stride_h - pad_top, w0 = ow * stride_w - pad_left;
        float m = -__int_as_float(0x7f800000);
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = h0 + kh * dil_h;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = w0 + kw * dil_w;
                if (iw < 0 || iw >= W) continue;
                m = fmaxf(m, xp[(long long)ih * W + iw]);
            }
        }
        y[i] = m;
    }
}

extern "C" __global__ void avgpool2d_nchw_f32(const float* __restrict__ x, float* __restrict__ y, long long NC, int H,
                                              int W, int OH, int OW, int KH, int KW, int stride_h, int stride_w,
                                              int pad_top, int pad_left, int pad_bottom, int pad_right, int dil_h,
                                              int dil_w, int count_include_pad) {
    const long long total = NC * OH * OW;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int ow = (int)(i % OW);
        const int oh = (int)((i / OW) % OH);
        const long long p = i / ((long long)OW * OH);
        const float* xp = x + p * H * (long long)W;
        const int h0 = oh * stride_h - pad_top, w0 = ow * stride_w - pad_left;
        float s = 0.0f;
        int rows_in = 0, rows_pad = 0, cols_in = 0, cols_pad = 0;
        for (int kh = 0; kh < KH; ++kh) {
            const int ih = h0 + kh * dil_h;
            rows_pad += (ih >= -pad_top && ih < H + pad_bottom);
            if (ih < 0 || ih >= H) continue;
            ++rows_in;
            for (int kw = 0; kw < KW; ++kw) {
                const int iw = w0 + kw * dil_w;
                if (iw < 0 || iw >= W) continue;
                s += xp[(long long)ih * W + iw];
            }
        }
        for (int kw = 0; kw < KW; ++kw) {
            const int iw = w0 + kw * dil_w;
            cols_pad += (iw >= -pad_left && iw < W + pad_right);
            cols_in += (iw >= 0 && iw < W);
        }
        const int div = count_include_pad ? rows_pad * cols_pad : rows_in * cols_in;
        y[i] = div > 0 ? s / (float)div : 0.0f;
    }
}

static __device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <bool MAX>
static __device__ float block_reduce(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : (MAX ? -__int_as_float(0x7f800000) : 0.0f);
        t = MAX ? warp_max(t) : warp_sum(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads();
    return r;
}

template <bool MAX>
static __device__ void global_pool(const float* __restrict__ x, float* __restrict__ y, long long NC, long long HW) {
    __shared__ float sh[33];
    for (long long p = blockIdx.x; p < NC; p += gridDim.x) {
        const float* xp = x + p * HW;
        float v = MAX ? -__int_as_float(0x7f800000) : 0.0f;
        for (long long j = threadIdx.x; j < HW; j += blockDim.x) v = MAX ? fmaxf(v, xp[j]) : v + xp[j];
        v = block_reduce<MAX>(v, sh);
        if (threadIdx.x == 0) y[p] = MAX ? v : v / (float)HW;
    }
}

extern "C" __global__ void global_avgpool_nchw_f32(const float* __restrict__ x, float* __restrict__ y, long long NC,
                                                   long long HW) {
    global_pool<false>(x, y, NC, HW);
}

extern "C" __global__ void global_maxpool_nchw_f32(const float* __restrict__ x, float* __restrict__ y, long long NC,
                                                   long long HW) {
    global_pool<true>(x, y, NC, HW);
}
