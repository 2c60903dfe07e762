//! CPython 3.11's hash functions. They decide where a key lands in a set's
//! table, and so the order a set prints in.

use num_bigint::{BigInt, Sign};
use num_traits::ToPrimitive;

const BITS: u32 = 61;
const MODULUS: u64 = (1 << BITS) - 1;
const INF: i64 = 314_159;
const IMAG: u64 = 1_000_003;

/// CPython hashes [`None`], `...` and NaN by address, which differs from run to
/// run; any fixed value is as good as CPython's.
pub(crate) const BY_ADDRESS: i64 = 0x1f3d_5b79;

fn fix(x: i64) -> i64 {
    if x == -1 {
        -2
    } else {
        x
    }
}

pub(crate) fn int(n: &BigInt) -> i64 {
    let r = if let Some(small) = n.to_i64() {
        (small.unsigned_abs() % MODULUS) as i64
    } else {
        (n.magnitude() % MODULUS).to_i64().unwrap_or(0)
    };
    fix(if n.sign() == Sign::Minus { -r } else { r })
}

/// frexp(3) for finite non-zero values: `v = m * 2**e` with `0.5 <= |m| < 1`.
fn frexp(v: f64) -> (f64, i32) {
    let bits = v.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal: scale into the normal range first.
        let (m, e) = frexp(v * f64::from_bits(0x43f0_0000_0000_0000)); // 2**64
        return (m, e - 64);
    }
    let m = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    (m, exp - 1022)
}

pub(crate) fn float(v: f64) -> i64 {
    if v.is_infinite() {
        return if v > 0.0 { INF } else { -INF };
    }
    if v.is_nan() {
        return BY_ADDRESS;
    }
    if v == 0.0 {
        return 0;
    }
    let (mut m, mut e) = frexp(v);
    let mut sign: i64 = 1;
    if m < 0.0 {
        sign = -1;
        m = -m;
    }
    let mut x: u64 = 0;
    while m != 0.0 {
        x = ((x << 28) & MODULUS) | (x >> (BITS - 28));
        m *= 268_435_456.0;
        e -= 28;
        let y = m as u64;
        m -= y as f64;
        x += y;
        if x >= MODULUS {
            x -= MODULUS;
        }
    }
    let e = if e >= 0 {
        e % BITS as i32
    } else {
        BITS as i32 - 1 - ((-1 - e) % BITS as i32)
    } as u32;
    x = ((x << e) & MODULUS) | (x >> (BITS - e));
    fix((x as i64).wrapping_mul(sign))
}

pub(crate) fn complex(re: f64, im: f64) -> i64 {
    let combined = (float(re) as u64).wrapping_add(IMAG.wrapping_mul(float(im) as u64));
    fix(combined as i64)
}

/// Tuple hash (xxHash-based, CPython 3.8+), from the items' hashes.
pub(crate) fn tuple(items: impl ExactSizeIterator<Item = i64>) -> i64 {
    const P1: u64 = 11_400_714_785_074_694_791;
    const P2: u64 = 14_029_467_366_897_019_727;
    const P5: u64 = 2_870_177_450_012_600_261;
    let len = items.len() as u64;
    let mut acc = P5;
    for lane in items {
        acc = acc.wrapping_add((lane as u64).wrapping_mul(P2));
        acc = acc.rotate_left(31);
        acc = acc.wrapping_mul(P1);
    }
    acc = acc.wrapping_add(len ^ (P5 ^ 3_527_539));
    if acc == u64::MAX {
        return 1_546_275_796;
    }
    acc as i64
}

/// SipHash-1-3 with the all-zero key: CPython's `str`/`bytes` hash when
/// `PYTHONHASHSEED=0`. With any other seed CPython's is random per process.
pub(crate) fn bytes(data: &[u8]) -> i64 {
    if data.is_empty() {
        return 0;
    }
    let (mut v0, mut v1, mut v2, mut v3): (u64, u64, u64, u64) = (
        0x736f_6d65_7073_6575,
        0x646f_7261_6e64_6f6d,
        0x6c79_6765_6e65_7261,
        0x7465_6462_7974_6573,
    );
    fn round(v0: &mut u64, v1: &mut u64, v2: &mut u64, v3: &mut u64) {
        fn half(a: &mut u64, b: &mut u64, c: &mut u64, d: &mut u64, s: u32, t: u32) {
            *a = a.wrapping_add(*b);
            *c = c.wrapping_add(*d);
            *b = b.rotate_left(s) ^ *a;
            *d = d.rotate_left(t) ^ *c;
            *a = a.rotate_left(32);
        }
        half(v0, v1, v2, v3, 13, 16);
        half(v2, v1, v0, v3, 17, 21);
    }
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mi = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        v3 ^= mi;
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        v0 ^= mi;
    }
    let mut tail = [0u8; 8];
    let rest = chunks.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    let b = ((data.len() as u64) << 56) | u64::from_le_bytes(tail);
    v3 ^= b;
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    v0 ^= b;
    v2 ^= 0xff;
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    fix(((v0 ^ v1) ^ (v2 ^ v3)) as i64)
}

/// A `str` is hashed over its code units in CPython's compact form: one, two
/// or four bytes per character, by its widest character.
pub(crate) fn str(s: &str) -> i64 {
    let widest = s.chars().map(u32::from).max().unwrap_or(0);
    if widest < 0x100 {
        if s.is_ascii() {
            return bytes(s.as_bytes());
        }
        let units: Vec<u8> = s.chars().map(|c| u32::from(c) as u8).collect();
        bytes(&units)
    } else if widest < 0x1_0000 {
        let units: Vec<u8> = s
            .chars()
            .flat_map(|c| (u32::from(c) as u16).to_le_bytes())
            .collect();
        bytes(&units)
    } else {
        let units: Vec<u8> = s.chars().flat_map(|c| u32::from(c).to_le_bytes()).collect();
        bytes(&units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by `PYTHONHASHSEED=0 /usr/bin/python3 -c 'print(hash(x))'`.
    #[test]
    fn hashes_are_cpythons() {
        assert_eq!(str(""), 0);
        assert_eq!(str("a"), 4644417185603328019);
        assert_eq!(str("abc"), -4594863902769663758);
        assert_eq!(str("abcdefgh"), 4574395652268504554);
        assert_eq!(str("abcdefghi"), -532774252720507163);
        assert_eq!(str("é"), 6047309291227476195);
        assert_eq!(str("日本"), 6243316497235261705);
        assert_eq!(str("\u{1f600}"), -3536540696076613844);
        assert_eq!(bytes(b"a"), 4644417185603328019);
        assert_eq!(tuple([1, str("a")].into_iter()), 3906047847676358913);
        assert_eq!(tuple([1, 2].into_iter()), -3550055125485641917);
        assert_eq!(float(1.5), 1152921504606846977);
        assert_eq!(int(&BigInt::from(-1)), -2);
        assert_eq!(int(&(BigInt::from(1) << 61u32)), 1);
        assert_eq!(float(1e300), 1224995262755759164);
        assert_eq!(float(0.1), 230584300921369408);
    }
}
