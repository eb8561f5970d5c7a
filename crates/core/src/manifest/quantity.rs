//! Quantities: `8GiB`, `512M`, `1073741824` → a number of bytes, and memory in whole MiB.
//!
//! The Go program's rules (original-proxops.md §1.2): a bare integer is bytes; `K M G T P`
//! (and `KB`...) are decimal, `Ki Mi Gi Ti Pi` (and `KiB`...) binary; suffixes are
//! case-insensitive; the number is an integer. Memory and swap must come to a whole number of
//! MiB, so `8G` (8,000,000,000 bytes) is refused with a hint to write `8GiB`.

use std::fmt;

use serde::Serialize;

/// A number of bytes, parsed from a quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ByteSize(u64);

/// One MiB in bytes.
const MIB: u64 = 1 << 20;
/// One GiB in bytes.
const GIB: u64 = 1 << 30;

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a number with an optional unit.
    #[error("`{0}` is not a quantity")]
    Malformed(String),
    /// A decimal point: quantities are integers.
    #[error("`{0}` is not a whole number")]
    Fraction(String),
    /// A unit we do not know.
    #[error("unknown unit `{unit}` in `{text}`")]
    UnknownUnit {
        /// The quantity as written.
        text: String,
        /// The unit as written.
        unit: String,
    },
    /// More than 2^64 bytes.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

impl QuantityError {
    /// How to fix it.
    pub fn help(&self) -> String {
        match self {
            QuantityError::Fraction(text) => match fraction_in_mib(text) {
                Some(mib) => format!("quantities are integers; write `{mib}MiB`"),
                None => "quantities are integers; use a smaller unit".to_owned(),
            },
            _ => "write an integer with an optional unit: K M G T P (decimal) or Ki Mi Gi Ti Pi \
                  (binary), e.g. `512MiB` or `20G`; a bare integer is bytes"
                .to_owned(),
        }
    }
}

/// The unit of a quantity, as the multiplier and whether it is binary.
fn unit(suffix: &str) -> Option<(u64, bool)> {
    let lower = suffix.to_ascii_lowercase();
    let lower = lower
        .strip_suffix('b')
        .filter(|rest| !rest.is_empty())
        .unwrap_or(&lower);
    let (letter, binary) = match lower.strip_suffix('i') {
        Some(letter) => (letter, true),
        None => (lower, false),
    };
    let power = match letter {
        "" if !binary => 0,
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        _ => return None,
    };
    let base: u64 = if binary { 1024 } else { 1000 };
    Some((base.pow(power), binary))
}

/// Splits `8 GiB` into `8` and `GiB`.
fn split(text: &str) -> (&str, &str) {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    (&text[..end], text[end..].trim_start())
}

/// `1.5GiB` as a whole number of MiB, when it is one (for the hint).
fn fraction_in_mib(text: &str) -> Option<u64> {
    let (number, suffix) = split(text);
    let (whole, frac) = number.split_once('.')?;
    let (multiplier, _) = unit(suffix)?;
    let digits = format!("{whole}{frac}").parse::<u128>().ok()?;
    let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let bytes = digits.checked_mul(u128::from(multiplier))?;
    (bytes % scale == 0 && (bytes / scale) % u128::from(MIB) == 0)
        .then(|| u64::try_from(bytes / scale / u128::from(MIB)).ok())
        .flatten()
}

impl ByteSize {
    /// A size of `bytes` bytes.
    pub const fn from_bytes(bytes: u64) -> Self {
        Self(bytes)
    }

    /// A size of `mib` MiB.
    pub const fn from_mib(mib: u64) -> Self {
        Self(mib * MIB)
    }

    /// Reads a quantity such as `8GiB`, `512M` or `1073741824`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let (number, suffix) = split(text);
        if number.is_empty() {
            return Err(QuantityError::Malformed(text.to_owned()));
        }
        if number.contains('.') {
            return Err(QuantityError::Fraction(text.to_owned()));
        }
        let Some((multiplier, _)) = unit(suffix) else {
            return Err(QuantityError::UnknownUnit {
                text: text.to_owned(),
                unit: suffix.to_owned(),
            });
        };
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier))
            .map(Self)
            .ok_or_else(|| QuantityError::TooLarge(text.to_owned()))
    }

    /// The number of bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// The size in MiB when it is a whole number of MiB.
    pub const fn whole_mib(self) -> Option<u64> {
        if self.0.is_multiple_of(MIB) {
            Some(self.0 / MIB)
        } else {
            None
        }
    }

    /// The size in GiB in its shortest decimal form, as PVE takes disk sizes (`0.5`, `32`).
    pub fn to_gib_string(self) -> String {
        let whole = self.0 / GIB;
        let rest = self.0 % GIB;
        if rest == 0 {
            return whole.to_string();
        }
        // GiB is 2^30, so any fraction of it has an exact decimal expansion of at most 30 digits.
        let mut digits = String::new();
        let mut remainder = u128::from(rest);
        while remainder != 0 && digits.len() < 30 {
            remainder *= 10;
            let digit = remainder / u128::from(GIB);
            remainder %= u128::from(GIB);
            digits.push(char::from(b'0' + u8::try_from(digit).unwrap_or(0)));
        }
        format!("{whole}.{digits}")
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.whole_mib() {
            Some(mib) if mib % 1024 == 0 && mib > 0 => write!(f, "{}GiB", mib / 1024),
            Some(mib) if mib > 0 => write!(f, "{mib}MiB"),
            _ => write!(f, "{}B", self.0),
        }
    }
}

/// Memory or swap: a whole number of MiB, as PVE takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Mebibytes(u64);

/// A quantity that is not a whole number of MiB, with the explanation and fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotWholeMib {
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: String,
}

impl Mebibytes {
    /// `mib` MiB.
    pub const fn new(mib: u64) -> Self {
        Self(mib)
    }

    /// The number of MiB (PVE's `memory`/`swap` value).
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Converts a parsed quantity, explaining a decimal unit when it does not come out whole.
    pub fn from_quantity(text: &str, size: ByteSize) -> Result<Self, NotWholeMib> {
        if let Some(mib) = size.whole_mib() {
            return Ok(Self(mib));
        }
        let (number, suffix) = split(text);
        let trimmed = text.trim();
        let decimal = unit(suffix).is_some_and(|(m, binary)| !binary && m > 1);
        let (message, help) = if decimal {
            let letter = suffix
                .chars()
                .next()
                .map(|c| c.to_ascii_uppercase())
                .unwrap_or('M');
            (
                format!(
                    "`{trimmed}` is not a whole number of MiB: `{suffix}` is decimal ({} bytes)",
                    size.bytes()
                ),
                format!("write `{number}{letter}iB` for binary units"),
            )
        } else if suffix.is_empty() {
            (
                format!("`{trimmed}` is not a whole number of MiB: a bare number is bytes"),
                format!("write `{number}MiB` if you mean MiB"),
            )
        } else {
            let nearest = size.bytes().div_ceil(MIB);
            (
                format!("`{trimmed}` is not a whole number of MiB"),
                format!("write a whole number of MiB, e.g. `{nearest}MiB`"),
            )
        };
        Err(NotWholeMib { message, help })
    }
}

impl fmt::Display for Mebibytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}MiB", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(text: &str) -> u64 {
        ByteSize::parse(text).unwrap().bytes()
    }

    #[test]
    fn bare_integers_are_bytes() {
        assert_eq!(bytes("1073741824"), GIB);
    }

    #[test]
    fn single_letter_units_are_decimal_and_i_units_binary_in_any_case() {
        assert_eq!(bytes("8G"), 8_000_000_000);
        assert_eq!(bytes("8gb"), 8_000_000_000);
        assert_eq!(bytes("8GiB"), 8 * GIB);
        assert_eq!(bytes("8gi"), 8 * GIB);
        assert_eq!(bytes("512MiB"), 512 * MIB);
        assert_eq!(bytes("2K"), 2000);
        assert_eq!(bytes("1Pi"), 1 << 50);
        assert_eq!(bytes("4 MiB"), 4 * MIB);
    }

    #[test]
    fn fractions_are_refused_with_the_equivalent_in_mib() {
        let err = ByteSize::parse("1.5GiB").unwrap_err();
        assert_eq!(err.to_string(), "`1.5GiB` is not a whole number");
        assert_eq!(err.help(), "quantities are integers; write `1536MiB`");
    }

    #[test]
    fn unknown_units_and_garbage_are_refused() {
        assert!(matches!(
            ByteSize::parse("8X"),
            Err(QuantityError::UnknownUnit { .. })
        ));
        assert!(matches!(
            ByteSize::parse("GiB"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            ByteSize::parse("-1G"),
            Err(QuantityError::Malformed(_))
        ));
        assert!(matches!(
            ByteSize::parse("99999999999P"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn memory_in_decimal_gigabytes_is_rejected_with_a_gib_hint() {
        let err = Mebibytes::from_quantity("8G", ByteSize::parse("8G").unwrap()).unwrap_err();
        assert_eq!(
            err.message,
            "`8G` is not a whole number of MiB: `G` is decimal (8000000000 bytes)"
        );
        assert_eq!(err.help, "write `8GiB` for binary units");
    }

    #[test]
    fn memory_as_a_bare_number_is_bytes_and_usually_not_whole_mib() {
        let err = Mebibytes::from_quantity("2048", ByteSize::parse("2048").unwrap()).unwrap_err();
        assert_eq!(err.help, "write `2048MiB` if you mean MiB");
    }

    #[test]
    fn binary_memory_converts_to_mib() {
        assert_eq!(
            Mebibytes::from_quantity("2GiB", ByteSize::parse("2GiB").unwrap()),
            Ok(Mebibytes(2048))
        );
    }

    #[test]
    fn disk_sizes_print_as_shortest_gib() {
        assert_eq!(ByteSize::parse("512MiB").unwrap().to_gib_string(), "0.5");
        assert_eq!(ByteSize::parse("32GiB").unwrap().to_gib_string(), "32");
        assert_eq!(
            ByteSize::parse("1M").unwrap().to_gib_string(),
            "0.000931322574615478515625"
        );
    }
}
