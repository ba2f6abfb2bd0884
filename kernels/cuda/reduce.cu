// reduce.cu — fp32 reductions over one axis. The tensor is seen as [outer, axis_len, inner] (row-major;
// reducing several adjacent axes = merging them into one). Output [outer, inner].
// Ops (op): 0 sum, 1 mean, 2 max, 3 min, 4 product, 5 sum of squares, 6 L1 (sum of |x|),
//     7 L2 (sqrt of the sum of squares), 8 log-sum-exp (max-shifted). An empty axis (axis_len == 0)
//     gives the identity: 0 for sums, NaN for the mean, -inf / +inf for max / min, 1 for product,
//     -inf for log-sum-exp. max/min use fmaxf/fminf (NaN inputs are skipped).
//
// reduce_axis_f32(x, y, outer, axis_len, inner, op)
//     One thread per output (outer*inner of them) walking the axis: coalesced when inner is large
//     (adjacent threads read adjacent k). Launch: 1-D grid-stride, e.g. blockDim.x = 256,
//     gridDim.x = min(ceil(outer*inner / 256), 65535).
// reduce_lastaxis_f32(x, y, rows, cols, op)
//     inner == 1 (reduce the last axis of [rows, cols]): one block per row, threads stride along the
//     row, warp-shuffle + static shared-memory (33 floats) block reduction. Launch: blocks stride over
//     rows (any gridDim.x <= rows, e.g. min(rows, 65535)); blockDim.x a multiple of 32, <= 1024.

static __device__ __forceinline__ float identity_of(int op) {
    switch (op) {
    case 2: case 8: return -__int_as_float(0x7f800000);
    case 3: return __int_as_float(0x7f800000);
    case 4: return 1.0f;
    default: return 0.0f;
    }
}

// Folds one input value into an accumulator (for log-sum-exp: the max pass).
static __device__ __forceinline__ float fold(float acc, float v, int op) {
    switch (op) {
    case 2: case 8: return fmaxf(acc, v);
    case 3: return fminf(acc, v);
    case 4: return acc * v;
    case 5: case 7: return fmaf(v, v, acc);
    case 6: return acc + fabsf(v);
    default: return acc + v;
    }
}

// Combines two partial accumulators.
static __device__ __forceinline__ float combine(float a, float b, int op) {
    switch (op) {
    case 2: case 8: return fmaxf(a, b);
    case 3: return fminf(a, b);
    case 4: return a * b;
    default: return a + b;
    }
}

static __device__ __forceinline__ float finish(float acc, long long n, int op) {
    switch (op) {
    case 1: return acc / (float)n;
    case 7: return sqrtf(acc);
    default: return acc;
    }
}

extern "C" __global__ void reduce_axis_f32(const float* __restrict__ x, float* __restrict__ y, long long outer,
                                           long long axis_len, long long inner, int op) {
    const long long total = outer * inner;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long k = i % inner, o = i / inner;
        const float* xo = x + o * axis_len * inner + k;
        float acc = identity_of(op);
        for (long long a = 0; a < axis_len; ++a) acc = fold(acc, xo[a * inner], op);
        if (op == 8) {
            const float m = acc;
            float s = 0.0f;
            if (m != -__int_as_float(0x7f800000))
                for (long long a = 0; a < axis_len; ++a) s += expf(xo[a * inner] - m);
            acc = m == -__int_as_float(0x7f800000) ? m : m + logf(s);
        }
        y[i] = finish(acc, axis_len, op);
    }
}

static __device__ float block_reduce(float v, int op, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o), op);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : identity_of(op);
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) t = combine(t, __shfl_xor_sync(0xffffffffu, t, o), op);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads();
    return r;
}

extern "C" __global__ void reduce_lastaxis_f32(const float* __restrict__ x, float* __restrict__ y, long long rows,
                                               long long cols, int op) {
    __shared__ float sh[33];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float acc = identity_of(op);
        for (long long j = threadIdx.x; j < cols; j += blockDim.x) acc = fold(acc, xr[j], op);
        acc = block_reduce(acc, op, sh);
        if (op == 8 && acc != -__int_as_float(0x7f800000)) {
            const float m = acc;
            float s = 0.0f;
            for (long long j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - m);
            acc = m + logf(block_reduce(s, 0, sh));
        }
        if (threadIdx.x == 0) y[r] = finish(acc, cols, op);
    }
}
