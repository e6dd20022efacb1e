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
}
