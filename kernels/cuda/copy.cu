// copy.cu — fp32 data movement: transpose, slice, concat, expand, gather, fill.
//
// strided_copy_f32(src, dst, n, rank, shape, src_strides, src_offset, dst_strides, dst_offset)
//     For every index idx of `shape` (rank <= 6, n = prod(shape) elements):
//     dst[dst_offset + sum idx[d]*dst_strides[d]] = src[src_offset + sum idx[d]*src_strides[d]].
//     Strides are in elements and may be 0 or negative. One kernel for all of:
//       transpose (general, rank <= 6): shape = output shape, dst strides contiguous, src strides = the
//         input's strides permuted (src_strides[d] = in_strides[perm[d]]);
//       slice: shape = slice shape, src_offset = sum start[d]*in_strides[d], src_strides[d] =
//         step[d]*in_strides[d] (negative steps fine), dst contiguous;
//       concat: one launch per input: shape = that input's shape, src contiguous, dst strides = the
//         output's, dst_offset = (sum of earlier inputs' extents on the axis) * out_strides[axis];
//       expand / broadcast: src_strides 0 on the broadcast dims.
//     dst ranges written must not overlap src ranges read.
// transpose2d_tiled_f32(x, y, batch, rows, cols)
//     y[b][c][r] = x[b][r][c] for x [batch, rows, cols]: the common last-two-axes transpose through a
//     32x33 shared-memory tile so both the read and the write are coalesced.
//     Launch shape: blockDim = (32, 8); gridDim = (ceil(cols/32), ceil(rows/32), min(batch, 65535))
//     (blocks stride over batch in z).
// gather_axis_i64_f32(x, idx, y, outer, axis_len, n_idx, inner) / gather_axis_i32_f32(...)
//     ONNX Gather: x [outer, axis_len, inner], idx [n_idx] (int64 / int32, negative counts from the end),
//     y[o][j][k] = x[o][idx[j]][k]. An index out of [-axis_len, axis_len) yields 0 (the host validates
//     constant indices; a kernel cannot raise).
// fill_f32(y, n, value)
//     y[i] = value.
// pad_f32(x, y, n, rank, out_shape, in_shape, in_strides, pads_begin, mode, value)
//     ONNX Pad: y (contiguous, out_shape, n elements) at index o reads x at i[d] = o[d] - pads_begin[d]
//     (pads_begin may be negative: cropping). Outside the input: mode 0 constant (value), 1 reflect
//     (mirror without repeating the edge, as numpy; a length-1 dim repeats its element), 2 edge
//     (clamp), 3 wrap (periodic). An empty input dim gives value whatever the mode.
//
// Launch shape (all but transpose2d_tiled_f32): 1-D grid-stride loops over the elements written
// (n, or outer*n_idx*inner for gather), e.g. blockDim.x = 256, gridDim.x = min(ceil(n / 256), 65535).

#define COPY_MAX_RANK 6

struct Dims6 {
    long long d[COPY_MAX_RANK];
};

extern "C" __global__ void strided_copy_f32(const float* __restrict__ src, float* __restrict__ dst, long long n,
                                            int rank, Dims6 shape, Dims6 src_strides, long long src_offset,
                                            Dims6 dst_strides, long long dst_offset) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rem = i, so = src_offset, doff = dst_offset;
        #pragma unroll
        for (int d = COPY_MAX_RANK - 1; d >= 0; --d) {
            if (d < rank) {
                const long long idx = rem % shape.d[d];
                rem /= shape.d[d];
                so += idx * src_strides.d[d];
                doff += idx * dst_strides.d[d];
            }
        }
        dst[doff] = src[so];
    }
}

extern "C" __global__ void transpose2d_tiled_f32(const float* __restrict__ x, float* __restrict__ y, long long batch,
                                                 int rows, int cols) {
    __shared__ float tile[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    const long long plane = (long long)rows * cols;
    for (long long b = blockIdx.z; b < batch; b += gridDim.z) {
        const float* xb = x + b * plane;
        float* yb = y + b * plane;
        for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
            const int r = r0 + dy, c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[dy][threadIdx.x] = xb[(long long)r * cols + c];
        }
        __syncthreads();
        for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
            const int c = c0 + dy, r = r0 + threadIdx.x;  // y is [cols, rows]
            if (c < cols && r < rows) yb[(long long)c * rows + r] = tile[threadIdx.x][dy];
        }
        __syncthreads();
    }
}

template <typename I>
static __device__ void gather_axis(const float* __restrict__ x, const I* __restrict__ idx, float* __restrict__ y,
                                   long long outer, long long axis_len, long long n_idx, long long inner) {
    const long long total = outer * n_idx * inner;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long k = i % inner;
        const long long j = (i / inner) % n_idx;
        const long long o = i / (inner * n_idx);
        long long a = (long long)idx[j];
        if (a < 0) a += axis_len;
        y[i] = (a >= 0 && a < axis_len) ? x[(o * axis_len + a) * inner + k] : 0.0f;
    }
}

extern "C" __global__ void gather_axis_i64_f32(const float* __restrict__ x, const long long* __restrict__ idx,
                                               float* __restrict__ y, long long outer, long long axis_len,
                                               long long n_idx, long long inner) {
    gather_axis<long long>(x, idx, y, outer, axis_len, n_idx, inner);
}

extern "C" __global__ void gather_axis_i32_f32(const float* __restrict__ x, const int* __restrict__ idx,
                                               float* __restrict__ y, long long outer, long long axis_len,
                                               long long n_idx, long long inner) {
    gather_axis<int>(x, idx, y, outer, axis_len, n_idx, inner);
}

extern "C" __global__ void fill_f32(float* __restrict__ y, long long n, float value) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = value;
    }
}

extern "C" __global__ void pad_f32(const float* __restrict__ x, float* __restrict__ y, long long n, int rank,
                                   Dims6 out_shape, Dims6 in_shape, Dims6 in_strides, Dims6 pads_begin, int mode,
                                   float value) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rem = i, off = 0;
        bool inside = true;
        #pragma unroll
        for (int d = COPY_MAX_RANK - 1; d >= 0; --d) {
            if (d < rank) {
                const long long len = in_shape.d[d];
                long long k = rem % out_shape.d[d] - pads_begin.d[d];
                rem /= out_shape.d[d];
                if (k < 0 || k >= len) {
                    if (mode == 1 && len == 1) {
                        k = 0;
                    } else if (mode == 1 && len > 1) {
                        const long long period = 2 * (len - 1);
                        k %= period;
                        if (k < 0) k += period;
                        if (k >= len) k = period - k;
                    } else if (mode == 2 && len > 0) {
                        k = k < 0 ? 0 : len - 1;
                    } else if (mode == 3 && len > 0) {
                        k %= len;
                        if (k < 0) k += len;
                    } else {
                        inside = false;
                        k = 0;
                    }
                }
                off += k * in_strides.d[d];
            }
        }
        y[i] = inside ? x[off] : value;
    }
}
