//! scp's argument syntax: which arguments of `hayate cp` are local paths, which name a place
//! reached through ssh (`[user@]host:path`, `[user@][v6addr]:path`) and which a running
//! `hayate serve` (`hayate://host[:port]/path`).

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    /// [user@]host:path or [user@][v6addr]:path ; path may be empty (= remote home)
    Ssh {
        user: Option<String>,
        host: String,
        path: String,
    },
    /// hayate://HOST[:PORT]/PATH (a running `hayate serve`)
    Daemon {
        host: String,
        port: u16,
        path: String,
    },
}

/// Parses one `hayate cp` argument the way scp does: a `:` before any `/` makes it remote
/// (`./a:b`, `/x:y` and `a/b:c` stay local); `[addr]:path` with an optional `user@` in front
/// is an IPv6 remote; `host:` means the remote home. `hayate://HOST[:PORT]/PATH` names a
/// running server (`default_port` when no port is given).
pub fn parse_location(s: &str, default_port: u16) -> Result<Location, String> {
    if s.is_empty() {
        return Err("empty path".to_string());
    }
    if let Some(rest) = s.strip_prefix("hayate://") {
        return parse_daemon(s, rest, default_port);
    }
    let Some((userhost, path)) = split_remote(s) else {
        return Ok(Location::Local(PathBuf::from(s)));
    };
    // The user is everything before the last '@' (outside brackets: split_remote saw to that).
    let (user, host) = match userhost.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, userhost),
    };
    let host = match host.strip_prefix('[') {
        Some(h) => h
            .strip_suffix(']')
            .ok_or_else(|| format!("{s}: bad [address]"))?,
        None => host,
    };
    if host.is_empty() {
        return Err(format!(
            "{s}: no host before ':' (write ./{s} for a local file)"
        ));
    }
    check_name(s, "host", host)?;
    if let Some(u) = user {
        if u.is_empty() {
            return Err(format!("{s}: empty user name before '@'"));
        }
        check_name(s, "user", u)?;
    }
    Ok(Location::Ssh {
        user: user.map(str::to_string),
        host: host.to_string(),
        path: path.to_string(),
    })
}

/// scp's `colon()`: the `[user@]host` part and the path when `s` is remote, None when local.
fn split_remote(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    let mut bracket = b.first() == Some(&b'[');
    for i in 0..b.len() {
        match b[i] {
            b'@' if b.get(i + 1) == Some(&b'[') => bracket = true,
            b']' if bracket && b.get(i + 1) == Some(&b':') => return Some((&s[..=i], &s[i + 2..])),
            b':' if !bracket => return Some((&s[..i], &s[i + 1..])),
            b'/' => return None,
            _ => {}
        }
    }
    None
}

/// Refuses names that ssh would take as an option or a shell would mangle.
fn check_name(s: &str, what: &str, name: &str) -> Result<(), String> {
    if name.starts_with('-') {
        return Err(format!("{s}: {what} name must not start with '-'"));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| c.is_whitespace() || c.is_control() || "'\"`#;&|<>()$\\".contains(c))
    {
        return Err(format!("{s}: {what} name with {c:?} in it"));
    }
    Ok(())
}

/// `hayate://HOST[:PORT]/PATH`, as `cp::parse_remote` has always taken it.
fn parse_daemon(s: &str, rest: &str, default_port: u16) -> Result<Location, String> {
    let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let (h, p) = h
            .split_once(']')
            .ok_or_else(|| format!("{s}: unclosed [ in IPv6 address"))?;
        if !p.is_empty() && !p.starts_with(':') {
            return Err(format!("{s}: junk after ]: {p:?}"));
        }
        (h.to_string(), p.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("{s}: no host"));
    }
    let port = match port {
        None | Some("") => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("{s}: bad port {p:?}")),
            Ok(p) => p,
        },
    };
    Ok(Location::Daemon {
        host,
        port,
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u16 = 5300;

    fn loc(s: &str) -> Location {
        parse_location(s, P).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn local(s: &str) -> Location {
        Location::Local(PathBuf::from(s))
    }

    fn ssh(user: Option<&str>, host: &str, path: &str) -> Location {
        Location::Ssh {
            user: user.map(str::to_string),
            host: host.to_string(),
            path: path.to_string(),
        }
    }

    fn daemon(host: &str, port: u16, path: &str) -> Location {
        Location::Daemon {
            host: host.to_string(),
            port,
            path: path.to_string(),
        }
    }

    #[test]
    fn local_paths() {
        for s in [
            "file",
            "a.txt",
            ".",
            "..",
            "/",
            "./a:b",
            "/x:y",
            "a/b:c",
            "../x:y",
            "dir/",
            "/abs/path/file",
            "~/x",
            "a@b",
            "[::1]",
            "[::1]/x:y",
            "user@[::1]",
            "we ird name",
            "-",
            "dir/é:x",
            "é",
        ] {
            assert_eq!(loc(s), local(s), "{s:?}");
        }
    }

    #[test]
    fn ssh_hosts() {
        assert_eq!(loc("host:path"), ssh(None, "host", "path"));
        assert_eq!(loc("host:/abs/path"), ssh(None, "host", "/abs/path"));
        assert_eq!(loc("host:dir/"), ssh(None, "host", "dir/"));
        assert_eq!(loc("host:"), ssh(None, "host", ""));
        assert_eq!(loc("user@host:"), ssh(Some("user"), "host", ""));
        assert_eq!(loc("user@host:x"), ssh(Some("user"), "host", "x"));
        assert_eq!(loc("h.example.com:a:b"), ssh(None, "h.example.com", "a:b"));
        assert_eq!(loc("10.0.0.1:x"), ssh(None, "10.0.0.1", "x"));
        assert_eq!(loc("host:a b"), ssh(None, "host", "a b"));
        assert_eq!(loc("host:~/x"), ssh(None, "host", "~/x"));
        // The last '@' before the ':' separates the user (scp does the same).
        assert_eq!(loc("a@b@host:p"), ssh(Some("a@b"), "host", "p"));
        // An '@' in the path is just part of the path.
        assert_eq!(loc("host:a@b"), ssh(None, "host", "a@b"));
        // Something with a colon that is not hayate:// is a host, even "hayate:".
        assert_eq!(loc("hayate:x"), ssh(None, "hayate", "x"));
        assert_eq!(loc("hayate:/x"), ssh(None, "hayate", "/x"));
    }

    #[test]
    fn ssh_ipv6() {
        assert_eq!(loc("[::1]:p"), ssh(None, "::1", "p"));
        assert_eq!(loc("[::1]:"), ssh(None, "::1", ""));
        assert_eq!(loc("[2001:db8::7]:/a/b"), ssh(None, "2001:db8::7", "/a/b"));
        assert_eq!(
            loc("user@[fe80::1%eth0]:p"),
            ssh(Some("user"), "fe80::1%eth0", "p")
        );
        assert_eq!(loc("u@[::1]:a:b"), ssh(Some("u"), "::1", "a:b"));
        assert_eq!(loc("[::1]:a/b]:c"), ssh(None, "::1", "a/b]:c"));
    }

    #[test]
    fn ssh_errors() {
        for s in [
            "",
            ":path",
            ":",
            "@host:p",
            "user@:p",
            "[]:p",
            "user@[]:p",
            "-oProxyCommand=x:p",
            "-host:p",
            "user@-host:p",
            "-user@host:p",
            "a b:c",
            "ho;st:p",
            "us'er@host:p",
            "ho$t:p",
            "h\tx:p",
        ] {
            assert!(parse_location(s, P).is_err(), "accepted {s:?}");
        }
    }

    #[test]
    fn daemon_urls() {
        assert_eq!(loc("hayate://h:5301/x"), daemon("h", 5301, "x"));
        assert_eq!(loc("hayate://h/x"), daemon("h", P, "x"));
        assert_eq!(loc("hayate://h:/x"), daemon("h", P, "x"));
        assert_eq!(loc("hayate://h"), daemon("h", P, ""));
        assert_eq!(loc("hayate://h/"), daemon("h", P, ""));
        assert_eq!(loc("hayate://h:9/isos/"), daemon("h", 9, "isos/"));
        assert_eq!(loc("hayate://h/a/b/c"), daemon("h", P, "a/b/c"));
        assert_eq!(loc("hayate://[::1]:5301/x"), daemon("::1", 5301, "x"));
        assert_eq!(loc("hayate://[::1]/x"), daemon("::1", P, "x"));
        assert_eq!(loc("hayate://[fe80::1%lo]"), daemon("fe80::1%lo", P, ""));
        assert_eq!(loc("hayate://10.0.0.1:77/x"), daemon("10.0.0.1", 77, "x"));
        assert_eq!(
            parse_location("hayate://h/x", 6000).unwrap(),
            daemon("h", 6000, "x")
        );
    }

    #[test]
    fn daemon_errors() {
        for s in [
            "hayate://",
            "hayate:///x",
            "hayate://:5300/x",
            "hayate://h:99999/x",
            "hayate://h:0/x",
            "hayate://h:port/x",
            "hayate://[::1/x",
            "hayate://[::1]x/y",
            "hayate://[]:5300/x",
        ] {
            assert!(parse_location(s, P).is_err(), "accepted {s:?}");
        }
    }
}
