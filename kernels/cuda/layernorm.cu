// layernorm.cu — fp32 normalisation over the last axis of a row-major [rows, cols] tensor.
//
// layernorm_lastaxis_f32(x, gamma, beta, y, rows, cols, eps)
//     mean_r = sum_j x[r, j] / cols;  var_r = sum_j (x[r, j] - mean_r)^2 / cols (biased, as ONNX
//     LayerNormalization and PyTorch);  y[r, j] = (x[r, j] - mean_r) / sqrt(var_r + eps) * gamma[j] + beta[j].
//     gamma and beta are [cols]; either may be NULL (1 and 0). Two-pass variance (centered), for
//     accuracy on rows with a large mean. In place (x == y) is allowed.
// rmsnorm_lastaxis_f32(x, gamma, y, rows, cols, eps)
//     y[r, j] = x[r, j] / sqrt(sum_j x[r, j]^2 / cols + eps) * gamma[j]; gamma may be NULL.
//
// Launch shape (both): one block per row (blocks stride over rows: any gridDim.x <= rows, e.g.
// min(rows, 65535)); blockDim.x a multiple of 32, at most 1024 (e.g. 256). Sums are block
// reductions: warp shuffles, then one partial per warp in static shared memory (33 floats).

static __device__ __forceinline__ float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
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

extern "C" __global__ void layernorm_lastaxis_f32(const float* x, const float* __restrict__ gamma,
                                                  const float* __restrict__ beta, float* y, long long rows,
                                                  long long cols, float eps) {
    __shared__ float sh[33];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
        const float mean = block_sum(s, sh) / (float)cols;
        float q = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            const float d = xr[j] - mean;
            q = fmaf(d, d, q);
        }
        const float rstd = rsqrtf(block_sum(q, sh) / (float)cols + eps);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = (xr[j] - mean) * rstd;
            if (gamma) v *= gamma[j];
            if (beta) v += beta[j];
            yr[j] = v;
        }
    }
}

extern "C" __global__ void rmsnorm_lastaxis_f32(const float* x, const float* __restrict__ gamma, float* y,
                                                long long rows, long long cols, float eps) {
    __shared__ float sh[33];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float q = 0.0f;
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) q = fmaf(xr[j], xr[j], q);
        const float rstd = rsqrtf(block_sum(q, sh) / (float)cols + eps);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = xr[j] * rstd;
            if (gamma) v *= gamma[j];
            yr[j] = v;
        }
    }
}
