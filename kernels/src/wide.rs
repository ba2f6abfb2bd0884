//! Loops written to auto-vectorise, compiled for the widest vectors this CPU has.
//!
//! The crates build for baseline x86-64 (SSE2) so that one binary runs everywhere. A plain
//! loop over slices (an elementwise op, a requantization) then vectorises only to 128 bits.
//! [`wide`] runs such a loop inside a function compiled for AVX-512 (F, BW, VL, DQ) or
//! AVX2 + FMA when the CPU has them: the closure is inlined there and the vectoriser, which
//! runs after inlining, uses that function's instruction set.

/// Runs `f` compiled for the widest vector instructions the CPU has. `f` must be a loop (or
/// call only `#[inline]` code) for this to change anything; its result is the same either way.
#[inline]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        match level() {
            Level::Avx512 => {
                // SAFETY: the CPU has these features (`level`).
                return unsafe { avx512(f) };
            }
            Level::Avx2 => {
                // SAFETY: as above.
                return unsafe { avx2(f) };
            }
            Level::Base => {}
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq)]
enum Level {
    Avx512,
    Avx2,
    Base,
}

#[cfg(target_arch = "x86_64")]
fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        use crate::isa::{Isa, allows};
        use std::arch::is_x86_feature_detected as has;
        let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq");
        if avx512 && allows(Isa::Avx512) {
            Level::Avx512
        } else if has!("avx2") && has!("fma") && allows(Isa::Avx2) {
            Level::Avx2
        } else {
            Level::Base
        }
    })
}

/// # Safety
/// The CPU has AVX-512 F, BW, VL and DQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_gives_the_same_result_wide_as_plain() {
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 * 0.37).sin() * 300.0).collect();
        let work = || {
            x.iter()
                .map(|&v| ((v / 0.7).round_ties_even().clamp(-128.0, 127.0)) as i8)
                .collect::<Vec<i8>>()
        };
        assert_eq!(wide(work), work());
    }
}
