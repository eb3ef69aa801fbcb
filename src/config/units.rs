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

/// Parses a Go duration: an optional sign, then one or more `<number><unit>`
/// with units `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`; `0` alone is allowed.
/// Negative durations are refused: no kinglet setting means anything by them.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?} (want e.g. \"10s\", \"1m30s\")");
    let t = s.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    if t.starts_with('-') {
        return Err(format!("negative duration {s:?}"));
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
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid quantity {s:?} (want e.g. \"100Mi\", \"1G\", \"500\")");
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return Err(bad());
    }
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad())?;
            10f64.powi(exp)
        }
        _ => return Err(bad()),
    };
    let v = (n * mult).ceil();
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(v as u64)
}

/// An eviction threshold value: an absolute quantity or a percentage of
/// capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ThresholdValue {
    Quantity(u64),
    Percent(f64),
}

impl ThresholdValue {
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(p) = s.trim().strip_suffix('%') {
            let v: f64 = p.parse().map_err(|_| format!("invalid percentage {s:?}"))?;
            if !(0.0..=100.0).contains(&v) {
                return Err(format!("percentage {s:?} must be between 0% and 100%"));
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
        for bad in ["", "plenty", "10XB", "Mi", "-5Mi", "1.2.3"] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} accepted");
        }
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
