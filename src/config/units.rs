//! Parsing and printing of the two value syntaxes Kubernetes config uses:
//! Go durations (`metav1.Duration`, e.g. `1m30s`) and resource quantities
//! (`100Mi`, `1.5G`, `250m`), plus eviction threshold values (`10%`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written the way Go's `time.ParseDuration` reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    pub const fn secs(s: u64) -> Self {
        GoDuration(Duration::from_secs(s))
    }
}

/// A duration, quantity or percentage that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("invalid duration {0:?} (want e.g. \"10s\", \"1m30s\")")]
    Duration(String),
    #[error("negative duration {0:?}")]
    NegativeDuration(String),
    #[error("invalid quantity {0:?} (want e.g. \"100Mi\", \"1G\", \"500\")")]
    Quantity(String),
    #[error("invalid percentage {0:?}")]
    Percentage(String),
    #[error("percentage {0:?} must be between 0% and 100%")]
    PercentageRange(String),
}

/// Parses a Go duration: an optional sign, then one or more `<number><unit>`
/// with units `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`; `0` alone is allowed.
/// Negative durations are refused: no kinglet setting means anything by them.
pub fn parse_go_duration(s: &str) -> Result<Duration, UnitError> {
    let bad = || UnitError::Duration(s.into());
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(UnitError::NegativeDuration(s.into()));
    }
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(bad());
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if num_len == 0 {
            return Err(bad());
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > u64::MAX as f64 / 2.0 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

impl fmt::Display for GoDuration {
    /// Prints as Go's `Duration.String` does for whole seconds: `1h2m3s`,
    /// `5m0s`, `10s`, `0s`; sub-second values as `1.5s` or `500ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        if d < Duration::from_secs(1) {
            let ns = d.as_nanos();
            return if ns.is_multiple_of(1_000_000) {
                write!(f, "{}ms", ns / 1_000_000)
            } else if ns.is_multiple_of(1000) {
                write!(f, "{}µs", ns / 1000)
            } else {
                write!(f, "{ns}ns")
            };
        }
        let secs = d.as_secs();
        let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
        let frac = d.subsec_nanos();
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if h > 0 || m > 0 {
            write!(f, "{m}m")?;
        }
        if frac == 0 {
            write!(f, "{s}s")
        } else {
            let frac = format!("{frac:09}");
            write!(f, "{s}.{}s", frac.trim_end_matches('0'))
        }
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Parses a Kubernetes resource quantity to its value in base units, rounded
/// up to a whole unit (as the kubelet does for bytes and counts).
pub fn parse_quantity(s: &str) -> Result<u64, UnitError> {
    let milli = parse_quantity_milli(s)?;
    u64::try_from(milli.div_ceil(1000)).map_err(|_| quantity_error(s))
}

fn quantity_error(s: &str) -> UnitError {
    UnitError::Quantity(s.into())
}

/// Parses a Kubernetes resource quantity to its value in thousandths of the
/// base unit (`250m` → 250, `1` → 1000, `1Ki` → 1,024,000), exactly: the
/// digits are read as integers, the one quantity parser of kinglet (config
/// values, pod resources, node status). Sub-milli parts round up, as
/// upstream's `MilliValue`.
pub fn parse_quantity_milli(s: &str) -> Result<u128, UnitError> {
    let bad = || quantity_error(s);
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || frac.len() > 30 {
        return Err(bad());
    }
    // The number as digits / 10^scale.
    let digits: u128 = format!("{int}{frac}")
        .trim_start_matches('0')
        .parse()
        .or_else(|e: std::num::ParseIntError| match e.kind() {
            std::num::IntErrorKind::Empty => Ok(0),
            _ => Err(bad()),
        })?;
    let scale = frac.len() as u32;
    // The suffix as (binary multiplier, decimal exponent), × 1000 for milli.
    let (bin, exp): (u128, i32) = match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        e if e.starts_with(['e', 'E']) => (1, e[1..].parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    };
    let exp = exp
        .checked_add(3)
        .and_then(|e| e.checked_sub(scale as i32))
        .ok_or_else(bad)?;
    let value = digits.checked_mul(bin).ok_or_else(bad)?;
    if exp >= 0 {
        10u128
            .checked_pow(exp as u32)
            .and_then(|m| value.checked_mul(m))
            .ok_or_else(bad)
    } else {
        let div = 10u128.checked_pow(exp.unsigned_abs()).unwrap_or(u128::MAX);
        Ok(value.div_ceil(div))
    }
}

/// An eviction threshold value: an absolute quantity or a percentage of
/// capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    Quantity(u64),
    Percent(f64),
}

impl ThresholdValue {
    pub fn parse(s: &str) -> Result<Self, UnitError> {
        if let Some(p) = s.trim().strip_suffix('%') {
            let v: f64 = p.parse().map_err(|_| UnitError::Percentage(s.into()))?;
            if !(0.0..=100.0).contains(&v) {
                return Err(UnitError::PercentageRange(s.into()));
            }
            return Ok(ThresholdValue::Percent(v / 100.0));
        }
        parse_quantity(s).map(ThresholdValue::Quantity)
    }

    /// The threshold in base units for a resource of the given capacity.
    pub fn resolve(&self, capacity: u64) -> u64 {
        match *self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percent(p) => (capacity as f64 * p) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let d = |s| parse_go_duration(s).unwrap();
        assert_eq!(d("10s"), Duration::from_secs(10));
        assert_eq!(d("5m0s"), Duration::from_secs(300));
        assert_eq!(d("1h2m3s"), Duration::from_secs(3723));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "10", "ten", "5x", "-1s", "s", "1..5s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn go_duration_display_round_trips() {
        for s in ["0s", "10s", "5m0s", "1h0m0s", "2m30s", "500ms", "1.5s"] {
            let d = GoDuration(parse_go_duration(s).unwrap());
            assert_eq!(d.to_string(), s);
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("100Mi").unwrap(), 100 << 20);
        assert_eq!(parse_quantity("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_quantity("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("1.5Ki").unwrap(), 1536);
        assert_eq!(parse_quantity("500").unwrap(), 500);
        assert_eq!(parse_quantity("1e3").unwrap(), 1000);
        assert_eq!(parse_quantity("100m").unwrap(), 1);
        for bad in [
            "", "plenty", "10XB", "Mi", "-5Mi", "1.2.3", ".", "1e", "99999Ei",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} accepted");
        }
        // Exact where floats are not, and as large as a node can name.
        assert_eq!(parse_quantity("9Ei").unwrap(), 9 << 60);
        assert_eq!(parse_quantity("0.1").unwrap(), 1);
        assert_eq!(parse_quantity("+2k").unwrap(), 2000);
        // Exponents past i32 or u128: refused, never wrapped.
        for huge in ["1e2147483647", "1.0000e-2147483648", "1e40"] {
            assert!(parse_quantity(huge).is_err(), "{huge}");
        }
    }

    #[test]
    fn quantities_in_thousandths() {
        let m = |s| parse_quantity_milli(s).unwrap();
        assert_eq!(m("250m"), 250);
        assert_eq!(m("1"), 1000);
        assert_eq!(m("0.5"), 500);
        assert_eq!(m("1.5Ki"), 1536 * 1000);
        assert_eq!(m("100n"), 1, "sub-milli rounds up");
        assert_eq!(m("0"), 0);
        assert_eq!(m("0.000"), 0);
        assert_eq!(m("1e-3"), 1);
        assert_eq!(m("2.5e2"), 250_000);
    }

    #[test]
    fn thresholds() {
        assert_eq!(ThresholdValue::parse("10%").unwrap().resolve(1000), 100);
        assert_eq!(
            ThresholdValue::parse("100Mi").unwrap().resolve(0),
            100 << 20
        );
        assert!(ThresholdValue::parse("150%").is_err());
        assert!(ThresholdValue::parse("lots%").is_err());
    }
}
