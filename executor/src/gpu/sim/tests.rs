use super::*;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_f32(d: &SimDevice, p: PinnedId, n: usize) -> Vec<f32> {
    let mut b = vec![0u8; n * 4];
    d.read_pinned(p, 0, &mut b).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn relu(x: DevPtr, y: DevPtr, n: i64) -> Launch {
    Launch {
        kernel: Kernel::EwUnary,
        grid: (1, 1, 1),
        block: (256, 1, 1),
        shared_mem: 0,
        args: vec![
            Arg::Ptr(x),
            Arg::Ptr(y),
            Arg::I64(n),
            Arg::I32(1),
            Arg::F32(0.0),
            Arg::F32(0.0),
        ],
    }
}

/// Copies, a launch and a copy back run in order on one stream; the host sees the result only
/// after waiting on an event recorded behind them.
#[test]
fn a_stream_runs_its_work_in_order_and_the_host_waits_on_an_event() {
    let d = SimDevice::new(4, 1 << 20);
    let s = d.new_stream().unwrap();
    let (inp, out) = (d.alloc_pinned(16).unwrap(), d.alloc_pinned(16).unwrap());
    let buf = DevPtr::new(d.alloc(16).unwrap(), 0);
    d.write_pinned(inp, 0, &f32_bytes(&[-1.0, 2.0, -3.0, 4.0]))
        .unwrap();
    let done = d.new_event(false).unwrap();
    d.copy_htod(s, inp, 0, buf, 16).unwrap();
    d.launch(s, &relu(buf, buf, 4)).unwrap();
    d.copy_dtoh(s, buf, out, 0, 16).unwrap();
    d.record(s, done).unwrap();
    d.sync_event(done).unwrap();
    assert_eq!(read_f32(&d, out, 4), [0.0, 2.0, 0.0, 4.0]);
}

/// A second stream's work that waits on an event runs after the first stream's work before the
/// record, even when the first stream is held up; without the wait it would not.
#[test]
fn an_event_wait_orders_work_across_streams() {
    let d = SimDevice::new(4, 1 << 20);
    let (a, b) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let (gate_event, inp, out) = (
        d.new_event(false).unwrap(),
        d.alloc_pinned(4).unwrap(),
        d.alloc_pinned(4).unwrap(),
    );
    let buf = DevPtr::new(d.alloc(4).unwrap(), 0);
    d.upload_now(buf, &f32_bytes(&[0.0])).unwrap();
    // Stream a is held before it writes 7; stream b reads after a's record.
    let held = d.hold(a);
    d.write_pinned(inp, 0, &f32_bytes(&[7.0])).unwrap();
    d.copy_htod(a, inp, 0, buf, 4).unwrap();
    d.record(a, gate_event).unwrap();
    d.wait(b, gate_event).unwrap();
    d.copy_dtoh(b, buf, out, 0, 4).unwrap();
    let fin = d.new_event(false).unwrap();
    d.record(b, fin).unwrap();
    *held.0.lock().unwrap() = true;
    held.1.notify_all();
    d.sync_event(fin).unwrap();
    assert_eq!(read_f32(&d, out, 1), [7.0]);
    // Without the wait, b reads before a (still held) writes.
    let held = d.hold(a);
    d.write_pinned(inp, 0, &f32_bytes(&[9.0])).unwrap();
    d.copy_htod(a, inp, 0, buf, 4).unwrap();
    d.copy_dtoh(b, buf, out, 0, 4).unwrap();
    d.record(b, fin).unwrap();
    d.sync_event(fin).unwrap();
    assert_eq!(read_f32(&d, out, 1), [7.0]);
    *held.0.lock().unwrap() = true;
    held.1.notify_all();
}

#[test]
fn waiting_on_an_event_never_recorded_does_not_hold() {
    let d = SimDevice::new(4, 1 << 20);
    let s = d.new_stream().unwrap();
    let (never, fin) = (d.new_event(false).unwrap(), d.new_event(false).unwrap());
    d.wait(s, never).unwrap();
    d.record(s, fin).unwrap();
    d.sync_event(fin).unwrap();
    d.sync_event(never).unwrap();
}

/// A copy reads pinned memory when it runs, not when it is issued: overwriting the staging
/// buffer before the copy has run changes what arrives (the runtime must wait first).
#[test]
fn copies_read_pinned_memory_when_they_run() {
    let d = SimDevice::new(4, 1 << 20);
    let s = d.new_stream().unwrap();
    let (inp, out) = (d.alloc_pinned(4).unwrap(), d.alloc_pinned(4).unwrap());
    let buf = DevPtr::new(d.alloc(4).unwrap(), 0);
    let gate = d.hold(s);
    d.write_pinned(inp, 0, &f32_bytes(&[1.0])).unwrap();
    d.copy_htod(s, inp, 0, buf, 4).unwrap();
    d.write_pinned(inp, 0, &f32_bytes(&[2.0])).unwrap();
    d.copy_dtoh(s, buf, out, 0, 4).unwrap();
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    let fin = d.new_event(false).unwrap();
    d.record(s, fin).unwrap();
    d.sync_event(fin).unwrap();
    assert_eq!(read_f32(&d, out, 1), [2.0]);
}

/// A kernel that reads past its buffer fails its stream; the failure surfaces at the next sync
/// and sticks, while other streams go on.
#[test]
fn errors_stick_to_their_stream() {
    let d = SimDevice::new(4, 1 << 20);
    let (s, t) = (d.new_stream().unwrap(), d.new_stream().unwrap());
    let buf = DevPtr::new(d.alloc(8).unwrap(), 0);
    let (e1, e2) = (d.new_event(false).unwrap(), d.new_event(false).unwrap());
    d.launch(s, &relu(buf, buf, 3)).unwrap();
    d.record(s, e1).unwrap();
    let err = d.sync_event(e1).unwrap_err();
    assert!(err.to_string().contains("past its end"), "{err}");
    d.launch(s, &relu(buf, buf, 2)).unwrap();
    d.record(s, e1).unwrap();
    assert!(d.sync_event(e1).is_err(), "sticky");
    d.launch(t, &relu(buf, buf, 2)).unwrap();
    d.record(t, e2).unwrap();
    d.sync_event(e2).unwrap();
}

#[test]
fn memory_is_bounded_and_timing_events_measure() {
    let d = SimDevice::new(4, 1024);
    assert!(matches!(
        d.alloc(2048),
        Err(DeviceError::OutOfMemory { bytes: 2048 })
    ));
    let b = d.alloc(1024).unwrap();
    assert!(d.alloc(1).is_err());
    d.free(b);
    assert_eq!(d.allocated_bytes(), 0);
    let s = d.new_stream().unwrap();
    let (t0, t1) = (d.new_event(true).unwrap(), d.new_event(true).unwrap());
    d.record(s, t0).unwrap();
    d.record(s, t1).unwrap();
    d.sync_event(t1).unwrap();
    let ms = d.elapsed_ms(t0, t1).unwrap();
    assert!(ms >= 0.0, "{ms}");
    let untimed = d.new_event(false).unwrap();
    d.record(s, untimed).unwrap();
    assert!(d.elapsed_ms(untimed, t1).is_err());
}

/// The simulated SGEMM is cuBLAS's column-major one: checked against a naive product, with
/// transposes, leading dimensions, batch strides, alpha and beta.
#[test]
fn sgemm_is_column_major_strided_batched() {
    let d = SimDevice::new(4, 1 << 20);
    let s = d.new_stream().unwrap();
    let (m, n, k, batch) = (3usize, 4usize, 5usize, 2usize);
    let (lda, ldb, ldc) = (k + 1, k + 2, m + 1);
    let val = |i: usize| ((i * 7919) % 13) as f32 - 6.0;
    // A is stored transposed (k × m, lda), B as is (k × n, ldb).
    let a: Vec<f32> = (0..batch * lda * m).map(val).collect();
    let b: Vec<f32> = (0..batch * ldb * n).map(|i| val(i + 3)).collect();
    let c0: Vec<f32> = (0..batch * ldc * n).map(|i| val(i + 5)).collect();
    let up = |v: &[f32]| {
        let p = DevPtr::new(d.alloc((v.len() * 4) as u64).unwrap(), 0);
        d.upload_now(p, &f32_bytes(v)).unwrap();
        p
    };
    let (pa, pb, pc) = (up(&a), up(&b), up(&c0));
    let g = Gemm {
        trans_a: true,
        trans_b: false,
        m,
        n,
        k,
        alpha: 0.5,
        a: pa,
        lda,
        stride_a: (lda * m) as i64,
        b: pb,
        ldb,
        stride_b: (ldb * n) as i64,
        beta: 2.0,
        c: pc,
        ldc,
        stride_c: (ldc * n) as i64,
        batch,
    };
    d.gemm(s, &g).unwrap();
    let out = d.alloc_pinned((c0.len() * 4) as u64).unwrap();
    d.copy_dtoh(s, pc, out, 0, (c0.len() * 4) as u64).unwrap();
    let e = d.new_event(false).unwrap();
    d.record(s, e).unwrap();
    d.sync_event(e).unwrap();
    let got = read_f32(&d, out, c0.len());
    for i in 0..batch {
        for col in 0..n {
            for row in 0..m {
                let mut acc = 0.0f32;
                for p in 0..k {
                    let av = a[i * lda * m + row * lda + p]; // op(A)(row, p) = A(p, row)
                    let bv = b[i * ldb * n + col * ldb + p];
                    acc += av * bv;
                }
                let at = i * ldc * n + col * ldc + row;
                let want = 0.5 * acc + 2.0 * c0[at];
                assert!((got[at] - want).abs() < 1e-4, "{i} {row} {col}");
            }
        }
        // The row of C past m (ldc > m) is untouched.
        assert_eq!(got[i * ldc * n + m], c0[i * ldc * n + m]);
    }
}
