//! Parsing of rates and sizes, and the number formats of the report.

use anyhow::{bail, Result};

/// A rate in bits/s: `50M`, `1.5G`, `800k`, `1000000`. Decimal multipliers, as on the wire.
pub fn parse_rate(s: &str) -> Result<u64> {
    let (num, mult) = split_suffix(s, 1_000.0)?;
    let v = num * mult;
    if !(1.0..1e13).contains(&v) {
        bail!("rate {s:?} out of range (1 bit/s .. 10 Tbit/s)");
    }
    Ok(v as u64)
}

/// A size in bytes: `256M`, `4k`, `1G`. Binary multipliers, as for memory.
pub fn parse_size(s: &str) -> Result<usize> {
    let (num, mult) = split_suffix(s, 1024.0)?;
    let v = num * mult;
    if !(1.0..1e15).contains(&v) {
        bail!("size {s:?} out of range");
    }
    Ok(v as usize)
}

fn split_suffix(s: &str, base: f64) -> Result<(f64, f64)> {
    let s = s.trim();
    let idx = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suf) = s.split_at(idx);
    // The parser's own words ("cannot parse float from empty string") describe the part
    // before the suffix, not what the user typed.
    let num: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("not a number: {s:?}"))?;
    let suf = suf.trim();
    let suf = suf
        .strip_suffix("bps")
        .or_else(|| suf.strip_suffix("bit/s"))
        .or_else(|| suf.strip_suffix("iB"))
        .or_else(|| suf.strip_suffix('B'))
        .unwrap_or(suf);
    let mult = match suf {
        "" => 1.0,
        "k" | "K" => base,
        "m" | "M" => base * base,
        "g" | "G" => base * base * base,
        "t" | "T" => base * base * base * base,
        _ => bail!("unknown suffix in {s:?} (use k, M, G, T)"),
    };
    Ok((num, mult))
}

pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Bytes over seconds, or 0 for an empty span.
pub fn per_sec(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / secs
    } else {
        0.0
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("50M").unwrap(), 50_000_000);
        assert_eq!(parse_rate("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("800k").unwrap(), 800_000);
        assert_eq!(parse_rate("1000").unwrap(), 1000);
        assert_eq!(parse_rate("100Mbps").unwrap(), 100_000_000);
        assert!(parse_rate("10X").is_err());
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("").is_err());
        // Named as typed, not as the number parser saw the part before the suffix.
        let e = parse_rate("abc").unwrap_err();
        assert_eq!(format!("{e:#}"), "not a number: \"abc\"");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("100").unwrap(), 100);
    }

    #[test]
    fn hex_roundtrip() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(unhex("0001abff").unwrap(), b);
        assert!(unhex("0g").is_none());
        assert!(unhex("abc").is_none());
    }
}
