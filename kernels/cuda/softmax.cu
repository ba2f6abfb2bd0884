// softmax.cu — fp32 softmax and log-softmax along the last axis of a row-major [rows, cols] tensor.
//
// softmax_lastaxis_f32(x, y, rows, cols)
//     y[r, j] = exp(x[r, j] - max_r) / sum_k exp(x[r, k] - max_r). In place (x == y) is allowed.
// log_softmax_lastaxis_f32(x, y, rows, cols)
//     y[r, j] = x[r, j] - max_r - log(sum_k exp(x[r, k] - max_r)). In place is allowed.
//
// Launch shape: one block per row (blocks stride over rows, so any gridDim.x <= rows works, e.g.
// min(rows, 65535)); blockDim.x a multiple of 32, at most 1024 (256 suits most rows). Threads stride
// over the row; the max and the sum are block reductions: warp shuffles, then one partial per warp in
// static shared memory (33 floats). Three passes over the row (max, sum, write). No dynamic shared memory.

static __device__ __forceinline__ float warp_max(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Every thread of the block gets the result. sh holds 33 floats; safe to call repeatedly.
static __device__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
        t = warp_max(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads();
    return r;
}

static __device__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads();
    return r;
}

template <bool LOG>
static __device__ void softmax_rows(const float* x, float* y, long long rows, long long cols) {
    __shared__ float sh[33];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = -__int_as_float(0x7f800000);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, xr[j]);
        m = block_max(m, sh);
        // A row of all -inf gives NaN, as the definition does (exp(-inf - -inf)).
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
        s = block_sum(s, sh);
        if (LOG) {
            const float ls = logf(s);
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = xr[j] - m - ls;
        } else {
            const float inv = 1.0f / s;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(xr[j] - m) * inv;
        }
    }
}

extern "C" __global__ void softmax_lastaxis_f32(const float* x, float* y, long long rows, long long cols) {
    softmax_rows<false>(x, y, rows, cols);
}

extern "C" __global__ void log_softmax_lastaxis_f32(const float* x, float* y, long long rows, long long cols) {
    softmax_rows<true>(x, y, rows, cols);
}
