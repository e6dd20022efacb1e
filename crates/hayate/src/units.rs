//! Parsing of the units users type: rates like `500M`, sizes, durations.

use hayate_proto::cc::RateConfig;

/// `RATE` in bits per second with an optional k/M/G/T suffix (powers of 1000), or `max`.
pub fn parse_rate(s: &str) -> Result<RateConfig, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("max") {
        return Ok(RateConfig::Unlimited);
    }
    let t = t
        .strip_suffix("bit")
        .or_else(|| t.strip_suffix("bps"))
        .unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('g' | 'G') => (&t[..t.len() - 1], 1e9),
        Some('t' | 'T') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid rate {s:?}: use bits/s like 500M, 2.5G or `max`"))?;
    let bits = v * mult;
    if !bits.is_finite() || bits < 8_000.0 {
        return Err(format!("rate {s:?} is too low (minimum 8k bits/s)"));
    }
    Ok(RateConfig::Fixed((bits / 8.0) as u64))
}

/// scp's `-l`: Kbit/s (1000 bits/s), a whole number above 0.
pub fn parse_kbit(s: &str) -> Result<RateConfig, String> {
    let k: u64 = s
        .trim()
        .parse()
        .ok()
        .filter(|k| *k > 0)
        .ok_or_else(|| format!("invalid limit {s:?}: Kbit/s as a whole number, like 8000"))?;
    parse_rate(&format!("{k}k"))
}

/// rsync's `--bwlimit`: bytes/s in units of 1024 unless a suffix says otherwise (`K`, `M`,
/// `G` or `KiB`... are powers of 1024, `KB`, `MB`, `GB` of 1000, `B` plain bytes), case
/// ignored; `0` means no cap, as in rsync.
pub fn parse_bwlimit(s: &str) -> Result<RateConfig, String> {
    let bad =
        || format!("invalid --bwlimit {s:?}: KiB/s like 1024, or with a suffix like 10M or 5MB");
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let mult = match unit {
        "" | "k" | "kib" => 1024.0,
        "b" => 1.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        _ => return Err(bad()),
    };
    if v == 0.0 {
        return Ok(RateConfig::Unlimited);
    }
    parse_rate(&format!("{}", v * mult * 8.0))
}

pub fn fmt_bits(bytes_per_sec: f64) -> String {
    let b = bytes_per_sec * 8.0;
    if b >= 1e9 {
        format!("{:.2} Gbit/s", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} Mbit/s", b / 1e6)
    } else {
        format!("{:.1} kbit/s", b / 1e3)
    }
}

pub fn fmt_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= 1e9 {
        format!("{:.2} GB", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1} MB", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.1} kB", f / 1e3)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("500M"), Ok(RateConfig::Fixed(62_500_000)));
        assert_eq!(parse_rate("1g"), Ok(RateConfig::Fixed(125_000_000)));
        assert_eq!(parse_rate("2.5G"), Ok(RateConfig::Fixed(312_500_000)));
        assert_eq!(parse_rate("100k"), Ok(RateConfig::Fixed(12_500)));
        assert_eq!(parse_rate("1gbit"), Ok(RateConfig::Fixed(125_000_000)));
        assert_eq!(parse_rate("max"), Ok(RateConfig::Unlimited));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-5M").is_err());
        assert!(parse_rate("1").is_err());
    }

    #[test]
    fn scp_limit_is_kbit() {
        assert_eq!(parse_kbit("8000"), Ok(RateConfig::Fixed(1_000_000)));
        assert_eq!(parse_kbit("64"), Ok(RateConfig::Fixed(8_000)));
        for bad in ["0", "-5", "1.5", "8M", ""] {
            assert!(parse_kbit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rsync_bwlimit_is_kib_unless_told() {
        assert_eq!(parse_bwlimit("1024"), Ok(RateConfig::Fixed(1024 * 1024)));
        assert_eq!(parse_bwlimit("100K"), Ok(RateConfig::Fixed(102_400)));
        assert_eq!(parse_bwlimit("1.5m"), Ok(RateConfig::Fixed(1_572_864)));
        assert_eq!(parse_bwlimit("5MB"), Ok(RateConfig::Fixed(5_000_000)));
        assert_eq!(parse_bwlimit("2MiB"), Ok(RateConfig::Fixed(2 << 20)));
        assert_eq!(parse_bwlimit("1G"), Ok(RateConfig::Fixed(1 << 30)));
        assert_eq!(parse_bwlimit("500kb"), Ok(RateConfig::Fixed(500_000)));
        assert_eq!(parse_bwlimit("4000b"), Ok(RateConfig::Fixed(4000)));
        assert_eq!(parse_bwlimit("0"), Ok(RateConfig::Unlimited));
        for bad in ["fast", "-1", "10X", "", "1e3"] {
            assert!(parse_bwlimit(bad).is_err(), "{bad}");
        }
    }
}
