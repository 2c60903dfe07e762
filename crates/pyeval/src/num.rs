//! Numbers with CPython's exact semantics: floor division and modulo,
//! correctly rounded int/int division and int->float conversion, `**` with
//! its special cases, complex arithmetic, exact int/float comparison, and
//! float repr.

use std::cmp::Ordering;

use num_bigint::{BigInt, BigUint, Sign};
use num_integer::Integer;
use num_traits::{One, Signed, ToPrimitive, Zero};

use crate::budget::Budget;
use crate::error::{overflow, zero_division, Error, ErrorKind, Result};
use crate::value::Value;

/// A numeric operand after bool -> int.
#[derive(Debug, Clone)]
pub(crate) enum Num {
    Int(BigInt),
    Float(f64),
    Complex(f64, f64),
}

impl Num {
    pub(crate) fn of(v: &Value) -> Option<Num> {
        match v {
            Value::Bool(b) => Some(Num::Int(BigInt::from(*b as u8))),
            Value::Int(n) => Some(Num::Int((**n).clone())),
            Value::Float(f) => Some(Num::Float(*f)),
            Value::Complex(re, im) => Some(Num::Complex(*re, *im)),
            _ => None,
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Num::Int(_) => 0,
            Num::Float(_) => 1,
            Num::Complex(..) => 2,
        }
    }

    pub(crate) fn to_f64(&self) -> Result<f64> {
        match self {
            Num::Int(n) => int_to_f64(n),
            Num::Float(f) => Ok(*f),
            Num::Complex(re, _) => Ok(*re),
        }
    }

    fn to_complex(&self) -> Result<(f64, f64)> {
        match self {
            Num::Complex(re, im) => Ok((*re, *im)),
            other => Ok((other.to_f64()?, 0.0)),
        }
    }
}

pub(crate) fn int_to_f64(n: &BigInt) -> Result<f64> {
    let f = n.to_f64().unwrap_or(f64::INFINITY);
    if f.is_infinite() {
        return Err(overflow("int too large to convert to float"));
    }
    Ok(f)
}

/// Binary numeric operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
    Pow,
    LShift,
    RShift,
    And,
    Or,
    Xor,
    MatMul,
}

impl Arith {
    pub(crate) fn symbol(self) -> &'static str {
        match self {
            Arith::Add => "+",
            Arith::Sub => "-",
            Arith::Mul => "*",
            Arith::Div => "/",
            Arith::FloorDiv => "//",
            Arith::Mod => "%",
            Arith::Pow => "** or pow()",
            Arith::LShift => "<<",
            Arith::RShift => ">>",
            Arith::And => "&",
            Arith::Or => "|",
            Arith::Xor => "^",
            Arith::MatMul => "@",
        }
    }
}

/// `a op b` for two numbers; [`None`] when Python would say the types are
/// unsupported (NotImplemented from both sides).
pub(crate) fn arith(op: Arith, a: Num, b: Num, budget: &mut Budget) -> Result<Option<Value>> {
    if op == Arith::MatMul {
        return Ok(None);
    }
    let rank = a.rank().max(b.rank());
    Ok(Some(match rank {
        0 => {
            let (Num::Int(x), Num::Int(y)) = (a, b) else {
                return Ok(None);
            };
            return int_arith(op, x, y, budget).map(Some);
        }
        1 => {
            if matches!(
                op,
                Arith::LShift | Arith::RShift | Arith::And | Arith::Or | Arith::Xor
            ) {
                return Ok(None);
            }
            let x = a.to_f64()?;
            let y = b.to_f64()?;
            return float_arith(op, x, y).map(Some);
        }
        _ => {
            if !matches!(
                op,
                Arith::Add | Arith::Sub | Arith::Mul | Arith::Div | Arith::Pow
            ) {
                return Ok(None);
            }
            let x = a.to_complex()?;
            let y = b.to_complex()?;
            let (re, im) = complex_arith(op, x, y)?;
            Value::Complex(re, im)
        }
    }))
}

fn bits(n: &BigInt) -> u64 {
    n.bits()
}

fn int_arith(op: Arith, x: BigInt, y: BigInt, budget: &mut Budget) -> Result<Value> {
    budget.tick()?;
    let r = match op {
        Arith::Add | Arith::Sub => {
            budget.int_bits(bits(&x).max(bits(&y)) + 1)?;
            if op == Arith::Add {
                x + y
            } else {
                x - y
            }
        }
        Arith::Mul => {
            budget.int_bits(bits(&x) + bits(&y))?;
            budget.ticks(bits(&x).min(bits(&y)) / 64 * (bits(&x).max(bits(&y)) / 4096 + 1))?;
            x * y
        }
        Arith::Div => return int_true_div(&x, &y).map(Value::Float),
        Arith::FloorDiv => {
            if y.is_zero() {
                return Err(zero_division("integer division or modulo by zero"));
            }
            budget.int_bits(bits(&x))?;
            x.div_floor(&y)
        }
        Arith::Mod => {
            if y.is_zero() {
                return Err(zero_division("integer modulo by zero"));
            }
            budget.int_bits(bits(&y))?;
            x.mod_floor(&y)
        }
        Arith::Pow => {
            if y.is_negative() {
                // long_pow hands negative exponents to float_pow.
                return float_arith(Arith::Pow, int_to_f64(&x)?, int_to_f64(&y)?);
            }
            int_pow(x, &y, budget)?
        }
        Arith::LShift => {
            if y.is_negative() {
                return Err(Error::new(ErrorKind::ValueError, "negative shift count"));
            }
            if x.is_zero() {
                BigInt::zero()
            } else {
                let n = y.to_u64().unwrap_or(u64::MAX);
                budget.int_bits(bits(&x).saturating_add(n))?;
                x << n
            }
        }
        Arith::RShift => {
            if y.is_negative() {
                return Err(Error::new(ErrorKind::ValueError, "negative shift count"));
            }
            match y.to_u64() {
                Some(n) if n < bits(&x) => x >> n,
                _ => {
                    if x.is_negative() {
                        -BigInt::one()
                    } else {
                        BigInt::zero()
                    }
                }
            }
        }
        Arith::And => x & y,
        Arith::Or => x | y,
        Arith::Xor => x ^ y,
        Arith::MatMul => {
            return Err(Error::new(
                ErrorKind::TypeError,
                "unsupported operand type(s) for @: 'int' and 'int'",
            ))
        }
    };
    Ok(Value::int(r))
}

fn int_pow(x: BigInt, y: &BigInt, budget: &mut Budget) -> Result<BigInt> {
    if y.is_zero() {
        return Ok(BigInt::one());
    }
    if x.is_zero() || x.is_one() {
        return Ok(x);
    }
    if x == BigInt::from(-1) {
        return Ok(if y.is_even() { BigInt::one() } else { x });
    }
    let e = y.to_u64().unwrap_or(u64::MAX);
    // An upper bound on the result's width: e * log2|x|, rounded up, plus slack for
    // the float's own rounding.
    let width = ((e as f64) * log2_abs(&x)).ceil();
    let width = if width >= u64::MAX as f64 {
        u64::MAX
    } else {
        width as u64 + 2
    };
    budget.int_bits(width)?;
    budget.ticks(width / 64 * (width / 4096 + 1))?;
    Ok(num_traits::pow::Pow::pow(x, e))
}

/// log2(|x|) for x != 0, from its top 64 bits.
fn log2_abs(x: &BigInt) -> f64 {
    let b = x.bits();
    if b <= 64 {
        return x.magnitude().to_f64().unwrap_or(0.0).log2();
    }
    let top = (x.magnitude() >> (b - 64)).to_f64().unwrap_or(1.0);
    top.log2() + (b - 64) as f64
}

/// int / int, correctly rounded (CPython's long_true_divide).
fn int_true_div(a: &BigInt, b: &BigInt) -> Result<f64> {
    if b.is_zero() {
        return Err(zero_division("division by zero"));
    }
    let negate = (a.sign() == Sign::Minus) != (b.sign() == Sign::Minus);
    let x = a.magnitude();
    let y = b.magnitude();
    if x.is_zero() {
        return Ok(if negate { -0.0 } else { 0.0 });
    }
    let q = ratio_to_f64(x, y)
        .ok_or_else(|| overflow("integer division result too large for a float"))?;
    Ok(if negate { -q } else { q })
}

/// x / y rounded to nearest-even as an f64; [`None`] on overflow.
fn ratio_to_f64(x: &BigUint, y: &BigUint) -> Option<f64> {
    // Scale so the quotient has at least 55 bits, and never look below the
    // smallest subnormal's last bit (2**-1074) to avoid double rounding.
    let mut sh = x.bits() as i64 - y.bits() as i64 - 55;
    let estimate = x.bits() as i64 - y.bits() as i64; // result's exponent, +-1
    if estimate < -1021 - 55 {
        sh = sh.max(-1074 - 2);
    }
    let (q, r) = if sh >= 0 {
        x.div_rem(&(y << sh as u64))
    } else {
        (x << (-sh) as u64).div_rem(y)
    };
    let mut q = q;
    let sticky = !r.is_zero();
    // How many low bits of q to round away: keep 53 significant bits, or
    // fewer when the result is subnormal.
    let qbits = q.bits() as i64;
    let top = qbits - 1 + sh; // exponent of q's leading bit
    let keep = if top < -1022 {
        (top + 1074 + 1).max(0)
    } else {
        53
    };
    let drop = (qbits - keep).max(0);
    let mut exp = sh;
    if drop > 0 {
        let half = BigUint::one() << (drop as u64 - 1);
        let low = &q & ((BigUint::one() << drop as u64) - BigUint::one());
        q >>= drop as u64;
        exp += drop;
        let round_up = match low.cmp(&half) {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => sticky || q.is_odd(),
        };
        if round_up {
            q += 1u32;
        }
    }
    let m = q.to_u64()? as f64; // exact: at most 54 bits
    let f = ldexp(m, exp);
    if f.is_infinite() {
        None
    } else {
        Some(f)
    }
}

/// m * 2**e, exact whenever the result is representable (m has at most 54
/// bits and was already rounded for the result's precision), in steps that
/// each stay within the exponent range.
fn ldexp(mut m: f64, mut e: i64) -> f64 {
    while e > 1000 {
        m *= pow2(1000);
        e -= 1000;
        if m.is_infinite() {
            return m;
        }
    }
    while e < -1000 {
        m *= pow2(-1000);
        e += 1000;
        if m == 0.0 {
            return m;
        }
    }
    m * pow2(e)
}

/// 2**e for -1074 <= e <= 1023.
fn pow2(e: i64) -> f64 {
    if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

fn float_arith(op: Arith, x: f64, y: f64) -> Result<Value> {
    Ok(Value::Float(match op {
        Arith::Add => x + y,
        Arith::Sub => x - y,
        Arith::Mul => x * y,
        Arith::Div => {
            if y == 0.0 {
                return Err(zero_division("float division by zero"));
            }
            x / y
        }
        Arith::FloorDiv => {
            if y == 0.0 {
                return Err(zero_division("float floor division by zero"));
            }
            float_divmod(x, y).0
        }
        Arith::Mod => {
            if y == 0.0 {
                return Err(zero_division("float modulo"));
            }
            let m = x % y;
            if m != 0.0 {
                if (y < 0.0) != (m < 0.0) {
                    m + y
                } else {
                    m
                }
            } else {
                0.0f64.copysign(y)
            }
        }
        Arith::Pow => return float_pow(x, y),
        _ => return Err(Error::new(ErrorKind::TypeError, "bad float operator")),
    }))
}

fn float_divmod(vx: f64, wx: f64) -> (f64, f64) {
    let mut m = vx % wx;
    let mut div = (vx - m) / wx;
    if m != 0.0 {
        if (wx < 0.0) != (m < 0.0) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = 0.0f64.copysign(wx);
    }
    let floordiv = if div != 0.0 {
        let mut f = div.floor();
        if div - f > 0.5 {
            f += 1.0;
        }
        f
    } else {
        0.0f64.copysign(vx / wx)
    };
    (floordiv, m)
}

fn is_odd_integer(x: f64) -> bool {
    (x.abs() % 2.0) == 1.0
}

/// float_pow, special cases first, then the C library's pow.
fn float_pow(iv: f64, iw: f64) -> Result<Value> {
    if iw == 0.0 {
        return Ok(Value::Float(1.0));
    }
    if iv.is_nan() {
        return Ok(Value::Float(iv));
    }
    if iw.is_nan() {
        return Ok(Value::Float(if iv == 1.0 { 1.0 } else { iw }));
    }
    if iw.is_infinite() {
        let av = iv.abs();
        return Ok(Value::Float(if av == 1.0 {
            1.0
        } else if (iw > 0.0) == (av > 1.0) {
            iw.abs()
        } else {
            0.0
        }));
    }
    if iv.is_infinite() {
        let odd = is_odd_integer(iw);
        return Ok(Value::Float(if iw > 0.0 {
            if odd {
                iv
            } else {
                iv.abs()
            }
        } else if odd {
            0.0f64.copysign(iv)
        } else {
            0.0
        }));
    }
    if iv == 0.0 {
        let odd = is_odd_integer(iw);
        if iw < 0.0 {
            return Err(zero_division("0.0 cannot be raised to a negative power"));
        }
        return Ok(Value::Float(if odd { iv } else { 0.0 }));
    }
    let mut iv = iv;
    let mut negate = false;
    if iv < 0.0 {
        if iw != iw.floor() {
            let (re, im) = complex_pow((iv, 0.0), (iw, 0.0))?;
            return Ok(Value::Complex(re, im));
        }
        iv = -iv;
        negate = is_odd_integer(iw);
    }
    if iv == 1.0 {
        return Ok(Value::Float(if negate { -1.0 } else { 1.0 }));
    }
    let ix = iv.powf(iw);
    if ix.is_infinite() {
        return Err(overflow("(34, 'Numerical result out of range')"));
    }
    Ok(Value::Float(if negate { -ix } else { ix }))
}

fn c_prod(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// _Py_c_quot; [`None`] is EDOM (division by zero).
fn c_quot(a: (f64, f64), b: (f64, f64)) -> Option<(f64, f64)> {
    let abs_breal = b.0.abs();
    let abs_bimag = b.1.abs();
    if abs_breal >= abs_bimag {
        if abs_breal == 0.0 {
            return None;
        }
        let ratio = b.1 / b.0;
        let denom = b.0 + b.1 * ratio;
        Some(((a.0 + a.1 * ratio) / denom, (a.1 - a.0 * ratio) / denom))
    } else if abs_bimag >= abs_breal {
        let ratio = b.0 / b.1;
        let denom = b.0 * ratio + b.1;
        Some(((a.0 * ratio + a.1) / denom, (a.1 * ratio - a.0) / denom))
    } else {
        Some((f64::NAN, f64::NAN))
    }
}

fn complex_arith(op: Arith, a: (f64, f64), b: (f64, f64)) -> Result<(f64, f64)> {
    Ok(match op {
        Arith::Add => (a.0 + b.0, a.1 + b.1),
        Arith::Sub => (a.0 - b.0, a.1 - b.1),
        Arith::Mul => c_prod(a, b),
        Arith::Div => c_quot(a, b).ok_or_else(|| zero_division("complex division by zero"))?,
        _ => complex_pow(a, b)?,
    })
}

fn complex_pow(a: (f64, f64), b: (f64, f64)) -> Result<(f64, f64)> {
    let mut edom = false;
    let p = if b.1 == 0.0 && b.0 == b.0.floor() && b.0.abs() <= 100.0 {
        let n = b.0 as i64;
        let powu = |x: (f64, f64), n: i64| {
            let mut r = (1.0, 0.0);
            let mut p = x;
            let mut mask: i64 = 1;
            while mask > 0 && n >= mask {
                if n & mask != 0 {
                    r = c_prod(r, p);
                }
                mask <<= 1;
                p = c_prod(p, p);
            }
            r
        };
        if n > 0 {
            powu(a, n)
        } else {
            match c_quot((1.0, 0.0), powu(a, -n)) {
                Some(q) => q,
                None => {
                    edom = true;
                    (0.0, 0.0)
                }
            }
        }
    } else if b.0 == 0.0 && b.1 == 0.0 {
        (1.0, 0.0)
    } else if a.0 == 0.0 && a.1 == 0.0 {
        if b.1 != 0.0 || b.0 < 0.0 {
            edom = true;
        }
        (0.0, 0.0)
    } else {
        let vabs = a.0.hypot(a.1);
        let mut len = vabs.powf(b.0);
        let at = a.1.atan2(a.0);
        let mut phase = at * b.0;
        if b.1 != 0.0 {
            len /= (at * b.1).exp();
            phase += b.1 * vabs.ln();
        }
        (len * phase.cos(), len * phase.sin())
    };
    if edom {
        return Err(zero_division("0.0 to a negative or complex power"));
    }
    if p.0.is_infinite() || p.1.is_infinite() {
        return Err(overflow("complex exponentiation"));
    }
    Ok(p)
}

/// Exact comparison of an int with a float (float_richcompare).
fn cmp_int_float(i: &BigInt, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    if f.is_infinite() {
        return Some(if f > 0.0 {
            Ordering::Less
        } else {
            Ordering::Greater
        });
    }
    let whole = f.trunc();
    let w = BigInt::from_f64_exact(whole);
    Some(match i.cmp(&w) {
        Ordering::Equal => {
            let frac = f - whole;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        o => o,
    })
}

trait FromF64Exact {
    fn from_f64_exact(f: f64) -> BigInt;
}

impl FromF64Exact for BigInt {
    fn from_f64_exact(f: f64) -> BigInt {
        num_traits::FromPrimitive::from_f64(f).unwrap_or_default()
    }
}

/// Ordering of two real numbers; [`None`] when unordered (NaN).
pub(crate) fn num_cmp(a: &Num, b: &Num) -> Option<Ordering> {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(y)),
        (Num::Int(x), Num::Float(y)) => cmp_int_float(x, *y),
        (Num::Float(x), Num::Int(y)) => cmp_int_float(y, *x).map(Ordering::reverse),
        (Num::Float(x), Num::Float(y)) => x.partial_cmp(y),
        _ => None,
    }
}

pub(crate) fn num_eq(a: &Num, b: &Num) -> bool {
    match (a, b) {
        (Num::Complex(r1, i1), Num::Complex(r2, i2)) => r1 == r2 && i1 == i2,
        (Num::Complex(re, im), other) | (other, Num::Complex(re, im)) => {
            *im == 0.0 && num_cmp(&Num::Float(*re), other) == Some(Ordering::Equal)
        }
        _ => num_cmp(a, b) == Some(Ordering::Equal),
    }
}

/// The shortest round-tripping decimal digits of a finite non-zero `x > 0`
/// and the exponent of the first one (`x = d.ddd * 10**exp`).
fn shortest_digits(x: f64) -> (String, i32) {
    let mut buf = ryu::Buffer::new();
    let text = buf.format_finite(x);
    let (mantissa, exp) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all: String = format!("{int_part}{frac_part}");
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = all
        .trim_start_matches('0')
        .trim_end_matches('0')
        .to_string();
    let exp10 = exp + int_part.len() as i32 - 1 - lead as i32;
    (digits, exp10)
}

/// repr() of a float ('r' format). `add_dot_0` is false inside complex
/// reprs, where `1.0` prints as `1`.
pub(crate) fn float_repr(x: f64, add_dot_0: bool) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        let z = if x.is_sign_negative() { "-0" } else { "0" };
        return if add_dot_0 {
            format!("{z}.0")
        } else {
            z.into()
        };
    }
    // Ryu gives the shortest digits that round-trip, breaking ties to even
    // as CPython's dtoa does; only the layout differs.
    let (digits, exp) = shortest_digits(x.abs());
    let sign = if x < 0.0 { "-" } else { "" };
    let n = digits.len() as i32;
    let decpt = exp + 1;
    let mut out = String::from(sign);
    if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-decpt) as usize));
            out.push_str(&digits);
        } else if decpt >= n {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
            if add_dot_0 {
                out.push_str(".0");
            }
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        out.push('e');
        out.push(if e < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", e.abs()));
    }
    out
}

pub(crate) fn complex_repr(re: f64, im: f64) -> String {
    if re == 0.0 && re.is_sign_positive() {
        return format!("{}j", float_repr(im, false));
    }
    let mut imag = float_repr(im, false);
    if !imag.starts_with('-') {
        imag.insert(0, '+');
    }
    format!("({}{}j)", float_repr(re, false), imag)
}
