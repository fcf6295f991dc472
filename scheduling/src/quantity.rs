//! Kubernetes resource quantities (`15Gi`, `500m`, `1e3`), parsed, compared and printed exactly as
//! the API server does, with checked integer arithmetic (never floats).
//!
//! A quantity is held as a count of nano-units in an `i128`: the API rounds every quantity up to
//! nano precision, and `i128` nanos reach about 1.7e29, far past any device capacity. Larger values
//! are refused with an error rather than rounded.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// How a quantity prints, chosen by the suffix it was parsed with (as in the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Powers of ten with SI suffixes: `n u m "" k M G T P E`.
    DecimalSI,
    /// Powers of two: `Ki Mi Gi Ti Pi Ei`.
    BinarySI,
    /// Scientific notation: `1e3`.
    DecimalExponent,
}

/// A quantity that cannot be parsed or computed; the message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text is not a quantity.
    #[error("quantity {input:?} is invalid: {reason}")]
    Invalid {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The value is outside what this crate represents exactly.
    #[error("quantity {0:?} is out of range")]
    OutOfRange(String),
    /// Arithmetic overflowed.
    #[error("quantity arithmetic overflowed")]
    Overflow,
}

/// A Kubernetes quantity: an exact decimal value with nano precision and a print format.
///
/// Equality and ordering compare values only, as the API's `Cmp` does: `1Gi == 1073741824`.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
}

impl Quantity {
    /// Zero.
    pub const ZERO: Self = Self { nanos: 0, format: Format::DecimalSI };

    /// An integer quantity printed in `format` (`from_int(4294967296, BinarySI)` prints `4Gi`).
    pub const fn from_int(value: i64, format: Format) -> Self {
        // Widening cast: every i64 fits i128 (`From` is not const).
        Self { nanos: value as i128 * NANOS_PER_UNIT, format }
    }

    /// `value / 1000`, printed with decimal suffixes (`from_milli(1)` prints `1m`).
    pub const fn from_milli(value: i64) -> Self {
        Self { nanos: value as i128 * (NANOS_PER_UNIT / 1000), format: Format::DecimalSI }
    }

    /// A byte count printed with binary suffixes.
    pub fn from_bytes(bytes: u64) -> Self {
        Self { nanos: i128::from(bytes) * NANOS_PER_UNIT, format: Format::BinarySI }
    }

    /// The same value printed in `format`.
    #[must_use]
    pub fn with_format(self, format: Format) -> Self {
        Self { format, ..self }
    }

    /// The print format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// Whether the value is zero.
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Whether the value is below zero.
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// The value rounded up to an integer, as the API's `Value()` does; `None` past `i64`.
    pub fn value_ceil(&self) -> Option<i64> {
        i64::try_from(ceil_div(self.nanos, NANOS_PER_UNIT)).ok()
    }

    /// The value as an integer when it is one and fits `u64` (byte counts, core counts).
    pub fn as_u64_exact(&self) -> Option<u64> {
        (self.nanos % NANOS_PER_UNIT == 0).then(|| u64::try_from(self.nanos / NANOS_PER_UNIT).ok()).flatten()
    }

    /// `self + other`, keeping `self`'s format (as the API's `Add`).
    ///
    /// # Errors
    /// [`QuantityError::Overflow`].
    pub fn checked_add(self, other: Self) -> Result<Self, QuantityError> {
        let nanos = self.nanos.checked_add(other.nanos).ok_or(QuantityError::Overflow)?;
        Ok(Self { nanos, ..self })
    }

    /// `self - other`, keeping `self`'s format.
    ///
    /// # Errors
    /// [`QuantityError::Overflow`].
    pub fn checked_sub(self, other: Self) -> Result<Self, QuantityError> {
        let nanos = self.nanos.checked_sub(other.nanos).ok_or(QuantityError::Overflow)?;
        Ok(Self { nanos, ..self })
    }

    /// `self * factor` for an integer factor.
    ///
    /// # Errors
    /// [`QuantityError::Overflow`].
    pub fn checked_mul(self, factor: i64) -> Result<Self, QuantityError> {
        let nanos = self.nanos.checked_mul(i128::from(factor)).ok_or(QuantityError::Overflow)?;
        Ok(Self { nanos, ..self })
    }

    /// `self * num / den` rounded down to a multiple of `grain` (which must be positive); used for
    /// scaling capacities by configured ratios without floats.
    ///
    /// # Errors
    /// [`QuantityError::Overflow`], or for a zero `den` or non-positive grain.
    pub fn scale_floor(self, num: i128, den: i128, grain: Self) -> Result<Self, QuantityError> {
        if den == 0 || grain.nanos <= 0 {
            return Err(QuantityError::Overflow);
        }
        let scaled = self.nanos.checked_mul(num).ok_or(QuantityError::Overflow)?.div_euclid(den);
        let nanos = scaled.div_euclid(grain.nanos) * grain.nanos;
        Ok(Self { nanos, ..self })
    }

    /// Parses a quantity as the API server does, rounding up to nano precision.
    ///
    /// # Errors
    /// [`QuantityError::Invalid`] naming the input, or [`QuantityError::OutOfRange`].
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let invalid = |reason| QuantityError::Invalid { input: input.to_owned(), reason };
        let out_of_range = || QuantityError::OutOfRange(input.to_owned());
        let (negative, rest) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            Some(_) => (false, input),
            None => return Err(invalid("it is empty")),
        };
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() {
            return Err(invalid("it has no digits"));
        }
        if frac.contains('.') {
            return Err(invalid("it has more than one decimal point"));
        }
        let (base, exponent, format) = parse_suffix(suffix)
            .ok_or_else(|| invalid("the suffix is not one of n u m k M G T P E Ki Mi Gi Ti Pi Ei or an exponent"))?;

        // mantissa * 10^-frac_digits * base^exponent, in nanos, rounded away from zero.
        let digits = whole.trim_start_matches('0').to_owned() + frac;
        let mut mantissa: i128 = 0;
        for d in digits.bytes() {
            mantissa = mantissa.checked_mul(10).and_then(|m| m.checked_add(i128::from(d - b'0'))).ok_or_else(out_of_range)?;
        }
        // Fold the nano scale, the fraction and a decimal exponent into one power of ten.
        let frac_digits = i32::try_from(frac.len()).map_err(|_| out_of_range())?;
        let (pow_ten, pow_two) = if base == 10 { (9 - frac_digits + exponent, 0) } else { (9 - frac_digits, exponent) };
        let mut numerator = mantissa;
        let mut denominator: i128 = 1;
        if mantissa != 0 {
            let ten = checked_pow(10, pow_ten.unsigned_abs()).ok_or_else(out_of_range)?;
            if pow_ten >= 0 {
                numerator = numerator.checked_mul(ten).ok_or_else(out_of_range)?;
            } else {
                denominator = ten;
            }
            let two = checked_pow(2, pow_two.unsigned_abs()).ok_or_else(out_of_range)?;
            numerator = numerator.checked_mul(two).ok_or_else(out_of_range)?;
        }
        let magnitude = ceil_div(numerator, denominator);
        Ok(Self { nanos: if negative { -magnitude } else { magnitude }, format })
    }
}

/// `(base, exponent, format)` for a suffix.
fn parse_suffix(suffix: &str) -> Option<(i128, i32, Format)> {
    let decimal = |e| Some((10, e, Format::DecimalSI));
    let binary = |e| Some((2, e, Format::BinarySI));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let digits = suffix.strip_prefix(['e', 'E'])?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let exponent: i32 = digits.parse().ok()?;
            Some((10, exponent, Format::DecimalExponent))
        }
    }
}

fn checked_pow(base: i128, exp: u32) -> Option<i128> {
    base.checked_pow(exp)
}

/// Division rounding away from zero for a positive divisor.
fn ceil_div(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d == 0 {
        q
    } else if n > 0 {
        q + 1
    } else {
        q - 1
    }
}

impl fmt::Display for Quantity {
    /// Prints the canonical form the API server returns.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let integral = self.nanos % NANOS_PER_UNIT == 0;
        let small = self.nanos.abs() < 1024 * NANOS_PER_UNIT;
        if self.format == Format::BinarySI && integral && !small {
            // Strip whole factors of 1024, up to Ei.
            let mut amount = self.nanos / NANOS_PER_UNIT;
            let mut power = 0;
            while power < 6 && amount % 1024 == 0 {
                amount /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return write!(f, "{amount}{suffix}");
        }
        // Decimal: strip factors of ten, then bring the exponent down to a multiple of three.
        let mut amount = self.nanos;
        let mut exponent: i32 = -9;
        while amount % 10 == 0 {
            amount /= 10;
            exponent += 1;
        }
        match exponent.rem_euclid(3) {
            1 => {
                amount *= 10;
                exponent -= 1;
            }
            2 => {
                amount *= 100;
                exponent -= 2;
            }
            _ => {}
        }
        let suffix = match (self.format, exponent) {
            (_, 0) => String::new(),
            (Format::DecimalExponent, e) => format!("e{e}"),
            (_, -9) => "n".into(),
            (_, -6) => "u".into(),
            (_, -3) => "m".into(),
            (_, 3) => "k".into(),
            (_, 6) => "M".into(),
            (_, 9) => "G".into(),
            (_, 12) => "T".into(),
            (_, 15) => "P".into(),
            (_, 18) => "E".into(),
            (_, e) => format!("e{e}"),
        };
        write!(f, "{amount}{suffix}")
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl serde::Serialize for Quantity {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(i64),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Text(s) => Self::parse(&s).map_err(serde::de::Error::custom),
            Raw::Int(i) => Ok(Self::from_int(i, Format::DecimalSI)),
        }
    }
}

#[cfg(test)]
#[path = "quantity_tests.rs"]
mod tests;
