//! Element types of fewer than 16 bits beyond int8/uint8: the float8 types (e4m3fn, e4m3fnuz,
//! e5m2, e5m2fnuz, e8m0), the 4-bit float e2m1, and 4- and 2-bit integers. They are stored, not
//! computed with: a tensor holds one code per element in a byte (the type's bit pattern in the
//! low bits), and Cast and the quantization ops convert them to and from wider types.
//! TensorProto packs the 4-bit types two to a byte and the 2-bit types four to a byte, the first
//! element in the lowest bits.
//!
//! Conversions follow the ONNX reference (which uses ml_dtypes): floats round to nearest even,
//! with the overflow rules of Cast's `saturate` attribute, and integers wrap to their width.

/// A storage-only element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Low {
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    /// A power of two (an exponent alone): scales of microscaling formats.
    F8E8M0,
    F4E2M1,
    U4,
    I4,
    U2,
    I2,
}

/// How Cast rounds to float8e8m0 (its `round_mode` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum E8M0Round {
    Up,
    Down,
    Nearest,
}

impl E8M0Round {
    pub fn parse(s: &str) -> Option<E8M0Round> {
        match s {
            "up" => Some(E8M0Round::Up),
            "down" => Some(E8M0Round::Down),
            "nearest" => Some(E8M0Round::Nearest),
            _ => None,
        }
    }
}

/// How a conversion to a low-bit float treats what it cannot represent: Cast's `saturate`
/// (out-of-range values become the largest finite value rather than infinity or NaN; float8
/// types and e8m0 only) and `round_mode` (e8m0 only) attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CastMode {
    pub saturate: bool,
    pub e8m0: E8M0Round,
}

impl Default for CastMode {
    fn default() -> CastMode {
        CastMode {
            saturate: true,
            e8m0: E8M0Round::Up,
        }
    }
}

/// The layout of a small float: exponent and mantissa widths, bias, and its special values.
struct Format {
    exp: u32,
    man: u32,
    bias: i32,
    /// Infinities exist (IEEE-like): the top exponent is reserved for them and NaNs.
    inf: bool,
    /// The "fnuz" types: one NaN (0x80, the negative zero's code) and no negative zero.
    uz: bool,
    /// NaN exists at all (float4e2m1 has none).
    nan: bool,
}

impl Format {
    fn sign_bit(&self) -> u8 {
        1 << (self.exp + self.man)
    }
    /// The largest finite code (positive).
    fn max_code(&self) -> u8 {
        let all = (1u16 << (self.exp + self.man)) as u8 - 1;
        match (self.inf, self.uz, self.nan) {
            // IEEE-like: exponent all ones is special.
            (true, _, _) => all - (1 << self.man) as u8,
            // e4m3fn: only S.1111.111 is NaN.
            (false, false, true) => all - 1,
            _ => all,
        }
    }
    fn decode(&self, code: u8) -> f32 {
        let sign = code & self.sign_bit() != 0;
        if self.uz && code == 0x80 {
            return f32::NAN;
        }
        let e = ((code >> self.man) as u32) & ((1 << self.exp) - 1);
        let m = (code as u32) & ((1 << self.man) - 1);
        let top = (1 << self.exp) - 1;
        if self.inf && e == top {
            let v = if m == 0 { f32::INFINITY } else { f32::NAN };
            return if sign { -v } else { v };
        }
        if !self.inf && !self.uz && self.nan && code & !self.sign_bit() == self.max_code() + 1 {
            return if sign { -f32::NAN } else { f32::NAN };
        }
        let mag = if e == 0 {
            m as f64 * 2f64.powi(1 - self.bias - self.man as i32)
        } else {
            (1.0 + m as f64 / (1u32 << self.man) as f64) * 2f64.powi(e as i32 - self.bias)
        };
        let v = mag as f32;
        if sign { -v } else { v }
    }
    /// The code of the value `2^e_field-bias * (1 + m)` built from a magnitude that is exactly
    /// representable (or zero).
    fn encode_exact(&self, mag: f64) -> u8 {
        if mag == 0.0 {
            return 0;
        }
        let ex = exponent(mag).max(1 - self.bias);
        let scaled = mag * 2f64.powi(self.man as i32 - ex);
        // Subnormals have a zero exponent field and no implicit one.
        let (e_field, m) = if scaled < (1u32 << self.man) as f64 {
            (0, scaled as u32)
        } else {
            ((ex + self.bias) as u32, scaled as u32 - (1 << self.man))
        };
        ((e_field << self.man) | m) as u8
    }
    fn encode(&self, x: f64, saturate: bool) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        if x.is_nan() {
            return match (self.uz, self.nan, self.inf) {
                (true, _, _) => 0x80,
                // No NaN code: ml_dtypes (the reference) gives a zero of the opposite sign.
                (_, false, _) => sign ^ self.sign_bit(),
                // e5m2: a quiet NaN, S.11111.10.
                (_, _, true) => sign | (self.max_code() + 3),
                _ => sign | (self.max_code() + 1),
            };
        }
        let max = self.decode(self.max_code()) as f64;
        let overflow = |sign: u8| -> u8 {
            match (saturate || !self.nan, self.uz, self.inf) {
                (true, _, _) => sign | self.max_code(),
                (false, true, _) => 0x80,
                (false, false, true) => sign | (self.max_code() + 1),
                (false, false, false) => sign | (self.max_code() + 1),
            }
        };
        let a = x.abs();
        if a.is_infinite() {
            return overflow(sign);
        }
        // Round to nearest even on the grid of the value's binade (subnormal spacing below
        // the smallest normal), then see whether the result fits.
        let ex = if a == 0.0 {
            1 - self.bias
        } else {
            exponent(a).max(1 - self.bias)
        };
        let q = (a * 2f64.powi(self.man as i32 - ex)).round_ties_even();
        let mag = q * 2f64.powi(ex - self.man as i32);
        if mag > max {
            return overflow(sign);
        }
        let code = self.encode_exact(mag);
        if code == 0 && self.uz {
            return 0;
        }
        sign | code
    }
}

/// `floor(log2(a))` of a positive finite f64.
fn exponent(a: f64) -> i32 {
    let bits = a.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i32;
    if e == 0 {
        // f64 subnormals are far below every small float's range: any value works.
        -1075
    } else {
        e - 1023
    }
}

const fn fmt(exp: u32, man: u32, bias: i32, inf: bool, uz: bool, nan: bool) -> Format {
    Format {
        exp,
        man,
        bias,
        inf,
        uz,
        nan,
    }
}

impl Low {
    pub fn from_onnx(code: i32) -> Option<Low> {
        Some(match code {
            17 => Low::F8E4M3FN,
            18 => Low::F8E4M3FNUZ,
            19 => Low::F8E5M2,
            20 => Low::F8E5M2FNUZ,
            21 => Low::U4,
            22 => Low::I4,
            23 => Low::F4E2M1,
            24 => Low::F8E8M0,
            25 => Low::U2,
            26 => Low::I2,
            _ => return None,
        })
    }
    pub fn onnx(self) -> i32 {
        match self {
            Low::F8E4M3FN => 17,
            Low::F8E4M3FNUZ => 18,
            Low::F8E5M2 => 19,
            Low::F8E5M2FNUZ => 20,
            Low::U4 => 21,
            Low::I4 => 22,
            Low::F4E2M1 => 23,
            Low::F8E8M0 => 24,
            Low::U2 => 25,
            Low::I2 => 26,
        }
    }
    /// Bits per element.
    pub fn bits(self) -> usize {
        match self {
            Low::U4 | Low::I4 | Low::F4E2M1 => 4,
            Low::U2 | Low::I2 => 2,
            _ => 8,
        }
    }
    /// Bytes that `n` packed elements take in a TensorProto.
    pub fn packed_len(self, n: usize) -> usize {
        n.div_ceil(8 / self.bits())
    }
    /// An integer type (uint4, int4, uint2, int2).
    pub fn is_int(self) -> bool {
        matches!(self, Low::U4 | Low::I4 | Low::U2 | Low::I2)
    }
    /// One of the four float8 types that Cast's `saturate` applies to.
    pub fn is_float8(self) -> bool {
        matches!(
            self,
            Low::F8E4M3FN | Low::F8E4M3FNUZ | Low::F8E5M2 | Low::F8E5M2FNUZ
        )
    }
    fn format(self) -> Option<Format> {
        Some(match self {
            Low::F8E4M3FN => fmt(4, 3, 7, false, false, true),
            Low::F8E4M3FNUZ => fmt(4, 3, 8, false, true, true),
            Low::F8E5M2 => fmt(5, 2, 15, true, false, true),
            Low::F8E5M2FNUZ => fmt(5, 2, 16, false, true, true),
            Low::F4E2M1 => fmt(2, 1, 1, false, false, false),
            _ => return None,
        })
    }
    /// The value of an integer type's code.
    pub fn int(self, code: u8) -> i64 {
        let b = self.bits() as u32;
        let v = (code & ((1u16 << b) - 1) as u8) as i64;
        match self {
            Low::I4 | Low::I2 if v >= 1 << (b - 1) => v - (1 << b),
            _ => v,
        }
    }
    /// The code of integer `v` wrapped to the type's width (as a cast of a wider integer does).
    pub fn from_int(self, v: i64) -> u8 {
        (v & ((1i64 << self.bits()) - 1)) as u8
    }
    /// The value of a code (exact in f32; integer types too).
    pub fn to_f32(self, code: u8) -> f32 {
        if let Some(f) = self.format() {
            return f.decode(code);
        }
        match self {
            Low::F8E8M0 if code == 0xff => f32::NAN,
            // 2^(code - 127); code 0 is 2^-127, an f32 subnormal.
            Low::F8E8M0 => f32::from_bits(match code {
                0 => 1 << 22,
                c => (c as u32) << 23,
            }),
            _ => self.int(code) as f32,
        }
    }
    /// The code nearest `x` (float types, by `mode`) or `x` truncated toward zero and wrapped
    /// (integer types).
    pub fn from_f64(self, x: f64, mode: CastMode) -> u8 {
        if let Some(f) = self.format() {
            return f.encode(x, mode.saturate);
        }
        match self {
            Low::F8E8M0 => e8m0(x as f32, mode.saturate, mode.e8m0),
            // `as` saturates (and maps NaN to 0) where C++ leaves it undefined.
            _ => self.from_int(x as i64),
        }
    }
}

/// float8e8m0 from f32 as the reference's `to_float8e8m0`: the f32 exponent, rounded by the
/// discarded mantissa; NaN and infinities become NaN (0xff), and the sign is ignored.
fn e8m0(x: f32, saturate: bool, round: E8M0Round) -> u8 {
    let bits = x.to_bits();
    let exp = (bits >> 23) & 0xff;
    if exp == 0xff {
        return 0xff;
    }
    let up = match round {
        E8M0Round::Down => false,
        E8M0Round::Up => bits & 0x7f_ffff != 0,
        E8M0Round::Nearest => {
            let g = bits & 0x40_0000 != 0;
            let r = bits & 0x20_0000 != 0;
            let s = bits & 0x1f_ffff != 0;
            let lsb = exp > 0;
            g && (r || s || lsb)
        }
    };
    let up = up && !(saturate && exp == 0xfe);
    (exp + up as u32) as u8
}

/// Codes packed as TensorProto stores them (4- and 2-bit types several to a byte).
pub fn pack(low: Low, codes: &[u8]) -> Vec<u8> {
    let bits = low.bits();
    if bits == 8 {
        return codes.to_vec();
    }
    let per = 8 / bits;
    let mask = ((1u16 << bits) - 1) as u8;
    codes
        .chunks(per)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u8, |b, (k, &v)| b | (v & mask) << (k * bits))
        })
        .collect()
}

/// `n` codes from packed bytes, which must be exactly [`Low::packed_len`]`(n)` long (checked
/// by the caller); padding bits are ignored.
pub fn unpack(low: Low, bytes: &[u8], n: usize) -> Vec<u8> {
    let bits = low.bits();
    if bits == 8 {
        return bytes[..n.min(bytes.len())].to_vec();
    }
    let per = 8 / bits;
    let mask = ((1u16 << bits) - 1) as u8;
    (0..n)
        .map(|i| {
            let b = bytes.get(i / per).copied().unwrap_or(0);
            (b >> (i % per * bits)) & mask
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float8_specials_and_limits() {
        let s = |l: Low, x: f64, saturate: bool| {
            let mode = CastMode {
                saturate,
                ..CastMode::default()
            };
            l.from_f64(x, mode)
        };
        // e4m3fn: max 448; 464 is a tie that rounds to 448, beyond it NaN unless saturating.
        assert_eq!(Low::F8E4M3FN.to_f32(0x7e), 448.0);
        assert_eq!(s(Low::F8E4M3FN, 464.0, false), 0x7e);
        assert_eq!(s(Low::F8E4M3FN, 465.0, false), 0x7f);
        assert_eq!(s(Low::F8E4M3FN, 1e6, true), 0x7e);
        assert_eq!(s(Low::F8E4M3FN, f64::NEG_INFINITY, true), 0xfe);
        assert_eq!(s(Low::F8E4M3FN, -0.0, true), 0x80);
        assert!(Low::F8E4M3FN.to_f32(0xff).is_nan());
        // fnuz: no negative zero, NaN is 0x80.
        assert_eq!(s(Low::F8E4M3FNUZ, -0.0, true), 0);
        assert_eq!(s(Low::F8E4M3FNUZ, -1e-7, true), 0);
        assert_eq!(s(Low::F8E4M3FNUZ, f64::INFINITY, false), 0x80);
        assert_eq!(Low::F8E4M3FNUZ.to_f32(0x7f), 240.0);
        assert!(Low::F8E5M2FNUZ.to_f32(0x80).is_nan());
        // e5m2: IEEE-like with infinities.
        assert_eq!(s(Low::F8E5M2, 61440.0, false), 0x7c);
        assert_eq!(s(Low::F8E5M2, 61439.0, false), 0x7b);
        assert_eq!(s(Low::F8E5M2, f64::NAN, false), 0x7e);
        assert_eq!(Low::F8E5M2.to_f32(0xfc), f32::NEG_INFINITY);
        assert_eq!(Low::F8E5M2.to_f32(0x01), 2f32.powi(-16));
        // Subnormals round to nearest even.
        assert_eq!(s(Low::F8E4M3FN, 1.5 * 2f64.powi(-9), true), 0x02);
        assert_eq!(s(Low::F8E4M3FN, 2f64.powi(-10), true), 0x00);
    }

    #[test]
    fn every_float_code_round_trips() {
        for low in [
            Low::F8E4M3FN,
            Low::F8E4M3FNUZ,
            Low::F8E5M2,
            Low::F8E5M2FNUZ,
            Low::F4E2M1,
        ] {
            let n = 1u16 << low.bits();
            for code in 0..n as u8 {
                let v = low.to_f32(code);
                if v.is_nan() {
                    continue;
                }
                assert_eq!(
                    low.from_f64(v as f64, CastMode::default()),
                    code,
                    "{low:?} {code:#x} = {v}"
                );
            }
        }
    }

    #[test]
    fn float4_saturates_and_e8m0_rounds_by_mode() {
        let f4 = |x| Low::F4E2M1.from_f64(x, CastMode::default());
        assert_eq!(
            [f4(0.75), f4(2.5), f4(5.0), f4(9.0), f4(-8.0)],
            [2, 4, 6, 7, 0xf]
        );
        assert_eq!(f4(f64::NAN), 0x8);
        let e = |x, e8m0| {
            let mode = CastMode {
                saturate: true,
                e8m0,
            };
            Low::F8E8M0.from_f64(x, mode)
        };
        assert_eq!(e(1.1, E8M0Round::Up), 128);
        assert_eq!(e(1.1, E8M0Round::Down), 127);
        assert_eq!(e(1.6, E8M0Round::Nearest), 128);
        assert_eq!(e(f64::INFINITY, E8M0Round::Up), 0xff);
        assert_eq!(Low::F8E8M0.to_f32(127), 1.0);
        assert_eq!(Low::F8E8M0.to_f32(0), 2f32.powi(-127));
    }

    #[test]
    fn integers_wrap_and_pack_low_bits_first() {
        assert_eq!(Low::I4.from_f64(-9.0, CastMode::default()), 7);
        assert_eq!(Low::I4.int(0xf), -1);
        assert_eq!(Low::U2.int(Low::U2.from_int(-1)), 3);
        assert_eq!(Low::I2.int(Low::I2.from_int(2)), -2);
        let codes = [1, 2, 3, 0, 1];
        let p = pack(Low::U2, &codes);
        assert_eq!(p, vec![0b00_11_10_01, 0b01]);
        assert_eq!(unpack(Low::U2, &p, 5), codes);
        assert_eq!(pack(Low::I4, &[0xf, 0x1, 0x7]), vec![0x1f, 0x07]);
        assert_eq!(unpack(Low::I4, &[0x1f, 0x07], 3), vec![0xf, 0x1, 0x7]);
        assert_eq!(Low::I4.packed_len(3), 2);
    }
}
