//! Remote globs as scp users type them (`host:'dir/*.fits'`): the far side expands the last
//! path component against one directory's names itself, with no shell involved. `*`, `?`,
//! `[abc]`, `[a-z]`, `[!x]` / `[^x]`, and `\` to take the next character literally. As in a
//! shell, a name starting with `.` is matched only by a pattern starting with `.`.

/// Whether the last component of `path` holds a wildcard (`*`, `?` or `[`), so the far side
/// expands it. Earlier components are taken literally.
pub fn is_pattern(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or_default();
    last.contains(['*', '?', '['])
}

/// Splits a pattern into the directory it lists (with its trailing `/`, "" for the
/// working directory or root) and the pattern for names in it.
pub fn split(pattern: &str) -> (&str, &str) {
    match pattern.rfind('/') {
        Some(i) => (&pattern[..=i], &pattern[i + 1..]),
        None => ("", pattern),
    }
}

/// Whether `name` matches the one-component `pattern` (see the module docs).
pub fn matches(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') && !pattern.starts_with("\\.") {
        return false;
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    match_from(&p, &n)
}

fn match_from(p: &[char], n: &[char]) -> bool {
    // Iterative with backtracking to the last `*`: linear in practice, never exponential.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi + 1, ni));
                pi += 1;
                continue;
            }
            Some('?') => Some(1),
            Some('[') if closed(&p[pi..]) => class(&p[pi..], n[ni]),
            Some('\\') if pi + 1 < p.len() => (p[pi + 1] == n[ni]).then_some(2),
            Some(&c) => (c == n[ni]).then_some(1),
            None => None,
        };
        match step {
            Some(len) => {
                pi += len;
                ni += 1;
            }
            None => match star {
                Some((sp, sn)) => {
                    pi = sp;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// `p` starts with `[` and has the `]` that ends the class (else `[` is an ordinary
/// character).
fn closed(p: &[char]) -> bool {
    let mut i = 1;
    if matches!(p.get(i), Some('!') | Some('^')) {
        i += 1;
    }
    // A `]` right after the opening (and `!`) is a member, not the end.
    i += 1;
    while let Some(&c) = p.get(i) {
        match c {
            ']' => return true,
            '\\' => i += 2,
            _ => i += 1,
        }
    }
    false
}

/// `p` starts with `[`: how many pattern characters the class takes if `c` is in it (None if
/// not). A `[` with no closing `]` is an ordinary character.
fn class(p: &[char], c: char) -> Option<usize> {
    let mut i = 1;
    let negate = matches!(p.get(i), Some('!') | Some('^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let &ch = p.get(i)?;
        if ch == ']' && !first {
            break;
        }
        first = false;
        let lo = if ch == '\\' && i + 1 < p.len() {
            i += 1;
            p[i]
        } else {
            ch
        };
        if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&h| h != ']') {
            let hi = p[i + 2];
            hit |= lo <= c && c <= hi;
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
    if hit != negate {
        Some(i + 1)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(matches("*.fits", "a.fits"));
        assert!(!matches("*.fits", ".fits"));
        assert!(!matches("*.fits", ".hidden.fits"));
        assert!(matches(".*", ".hidden"));
        assert!(matches("*", "a;rm -rf x"));
        assert!(!matches("*.fits", "a.fit"));
        assert!(matches("a?c", "abc"));
        assert!(!matches("a?c", "ac"));
        assert!(matches("[ab]*", "b1"));
        assert!(!matches("[!ab]*", "b1"));
        assert!(matches("[^ab]*", "c1"));
        assert!(matches("x[0-9]", "x7"));
        assert!(!matches("x[0-9]", "xa"));
        assert!(matches("[]]", "]"));
        assert!(matches("a\\*", "a*"));
        assert!(!matches("a\\*", "ab"));
        assert!(matches("[", "["));
        assert!(matches("*a*b*c*", "xxaxxbxxcxx"));
        assert!(!matches("*a*b*c*", "xxaxxcxxbxx"));
        assert!(matches("**", ""));
        assert!(matches("日*", "日本"));
    }

    #[test]
    fn patterns_and_directories() {
        assert!(is_pattern("dir/*.fits"));
        assert!(is_pattern("~/logs/x?.log"));
        assert!(!is_pattern("d*r/plain"));
        assert!(!is_pattern("plain"));
        assert_eq!(split("dir/*.fits"), ("dir/", "*.fits"));
        assert_eq!(split("*.fits"), ("", "*.fits"));
        assert_eq!(split("/*"), ("/", "*"));
    }
}
