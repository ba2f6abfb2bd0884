//! Which instruction sets the kernels may use: all the CPU has, or fewer where `COTENANT_ISA`
//! caps them. The cap runs another CPU's paths on this one: `avx2` the kernels of an AVX2 CPU
//! without AVX-512 (an older EPYC), `avx512` those of an AVX-512 CPU without AMX (a Zen 4),
//! `portable` the plain Rust ones. The tests run under each cap, and the benchmarks measure
//! them; a cap above what the CPU has changes nothing.

/// The instruction-set levels of the kernels, each including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// No vector kernels: the plain Rust loops.
    Portable,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 (F, BW, VL, DQ, and VNNI where the CPU has it).
    Avx512,
    /// AVX-512 and AMX's int8 tiles.
    Amx,
}

/// The environment variable that caps the instruction sets.
pub const CAP_VAR: &str = "COTENANT_ISA";

impl Isa {
    const NAMES: [(&'static str, Isa); 4] = [
        ("portable", Isa::Portable),
        ("avx2", Isa::Avx2),
        ("avx512", Isa::Avx512),
        ("amx", Isa::Amx),
    ];

    /// The level named `name` (`portable`, `avx2`, `avx512` or `amx`).
    pub fn parse(name: &str) -> Result<Isa, String> {
        let known = Isa::NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>();
        Isa::NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|&(_, isa)| isa)
            .ok_or_else(|| format!("{CAP_VAR}={name:?} is not one of {}", known.join(", ")))
    }

    pub fn name(self) -> &'static str {
        Isa::NAMES.iter().find(|(_, i)| *i == self).unwrap().0
    }
}

/// The cap `COTENANT_ISA` sets, if any; an error names a value that is not a level. A program
/// checks this at start-up: the kernels ignore a value they cannot read.
pub fn cap_from_env() -> Result<Option<Isa>, String> {
    match std::env::var(CAP_VAR) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => Isa::parse(&v).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("{CAP_VAR}={v:?} is not a level")),
    }
}

/// The highest level the kernels may use (read once).
fn cap() -> Isa {
    static CAP: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| cap_from_env().ok().flatten().unwrap_or(Isa::Amx))
}

/// Whether the kernels of `level` may run, as far as the cap goes (each kernel also checks that
/// the CPU has its instructions).
#[inline]
pub(crate) fn allows(level: Isa) -> bool {
    level <= cap()
}

/// The level the kernels run at on this CPU under the cap.
pub fn in_use() -> Isa {
    let level = if crate::qamx_available() {
        Isa::Amx
    } else if crate::avx512f() {
        Isa::Avx512
    } else if crate::nhwc_conv::available() {
        Isa::Avx2
    } else {
        Isa::Portable
    };
    level.min(cap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_by_name_and_refuse_others() {
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Amx] {
            assert_eq!(Isa::parse(isa.name()), Ok(isa));
        }
        assert_eq!(Isa::parse(" AVX2 "), Ok(Isa::Avx2));
        for bad in ["", "sse4", "avx-512", "avx2,fma"] {
            let e = Isa::parse(bad).unwrap_err();
            assert!(e.contains(CAP_VAR) && e.contains("avx512"), "{e}");
        }
        assert!(Isa::Portable < Isa::Avx2 && Isa::Avx512 < Isa::Amx);
    }

    #[test]
    fn the_level_in_use_is_within_the_cap() {
        assert!(in_use() <= cap());
        assert_eq!(crate::avx512f(), in_use() >= Isa::Avx512);
    }
}
