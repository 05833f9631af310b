//! Stable, valid Kubernetes names for everything the planner creates.

/// Lower-case, `[a-z0-9-]` only, no leading/trailing/double dashes.
pub fn slug(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut dash = false;
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
            dash = false;
        } else if !dash && !out.is_empty() {
            out.push('-');
            dash = true;
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// Join parts with `-` and keep the result a valid name of at most `max` characters:
/// over-long names are cut and suffixed with a short stable hash of the full name,
/// so two long names never collide after cutting.
pub fn bounded(parts: &[&str], max: usize) -> String {
    let joined = parts
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("-");
    if joined.len() <= max {
        return joined;
    }
    let hash = format!("{:08x}", fnv1a(joined.as_bytes()) as u32);
    let keep = max - hash.len() - 1;
    let mut cut = joined[..keep].to_string();
    while cut.ends_with('-') || cut.ends_with('.') {
        cut.pop();
    }
    format!("{cut}-{hash}")
}

/// The first `shown` names, comma-separated, and how many more there are:
/// `a, b, c and 2 more` (a message names a few nodes, not thousands).
pub fn first_few<'a>(names: impl ExactSizeIterator<Item = &'a str>, shown: usize) -> String {
    let more = names.len().saturating_sub(shown);
    let mut out = names.take(shown).collect::<Vec<_>>().join(", ");
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

/// The hasher of in-memory change fingerprints (a poll's view of health, a
/// watched object's spec and metadata, a planned object's JSON): fast, and fixed,
/// so one process's hashes compare. Never stored: what is written to the cluster
/// uses [`fnv1a`], which is stable across versions.
pub const FINGERPRINTS: foldhash::fast::FixedState =
    foldhash::fast::FixedState::with_seed(0x6b61_6363);

/// FNV-1a: tiny, stable across Rust versions (unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash = Fnv1a::default();
    hash.update(bytes);
    hash.0
}

/// FNV-1a over text written in pieces (`serde_json::to_writer` into it hashes
/// an object's JSON without holding the text).
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a(pub u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf29ce484222325)
    }
}

impl Fnv1a {
    pub fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x100000001b3);
        }
    }
}

impl std::io::Write for Fnv1a {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Case-insensitive glob with `*` (any run) and `?` (one character).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Compare dotted numeric versions (`550.54.15` vs `550.100`), missing parts as 0.
/// `None` when either side is not a dotted number.
pub fn version_at_least(have: &str, want: &str) -> Option<bool> {
    let parse = |s: &str| -> Option<Vec<u64>> {
        s.trim()
            .trim_start_matches('v')
            .split('.')
            .map(|p| p.parse::<u64>().ok())
            .collect()
    };
    let (h, w) = (parse(have)?, parse(want)?);
    let len = h.len().max(w.len());
    for i in 0..len {
        let (a, b) = (
            h.get(i).copied().unwrap_or(0),
            w.get(i).copied().unwrap_or(0),
        );
        if a != b {
            return Some(a > b);
        }
    }
    Some(true)
}

/// Is `key` a valid Kubernetes label key (`[prefix/]name`)?
pub fn valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    prefix.is_none_or(valid_dns_subdomain) && valid_label_value(name) && !name.is_empty()
}

/// Is `value` a valid label value (may be empty)?
pub fn valid_label_value(value: &str) -> bool {
    value.len() <= 63
        && (value.is_empty()
            || (value
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
                && value
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

pub fn valid_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A DNS label (RFC 1123): a namespace's or a MultiKueue worker's name.
pub fn valid_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && valid_dns_subdomain(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_few_names_a_few_and_counts_the_rest() {
        let names = ["a", "b", "c", "d", "e"];
        assert_eq!(first_few(names.iter().copied(), 3), "a, b, c and 2 more");
        assert_eq!(first_few(names.iter().copied(), 5), "a, b, c, d, e");
        assert_eq!(first_few(names[..1].iter().copied(), 3), "a");
        assert_eq!(first_few([].into_iter(), 3), "");
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("NVIDIA-H100-80GB-HBM3"), "nvidia-h100-80gb-hbm3");
        assert_eq!(slug("AMD_Instinct_MI300X"), "amd-instinct-mi300x");
        assert_eq!(slug("1g.10gb"), "1g-10gb");
        assert_eq!(slug("--x--"), "x");
    }

    #[test]
    fn globs() {
        assert!(glob_match("*H100*", "NVIDIA-H100-80GB-HBM3"));
        assert!(glob_match("nvidia-h100*", "NVIDIA-H100-80GB-HBM3"));
        assert!(!glob_match("*A100*", "NVIDIA-H100-80GB-HBM3"));
        assert!(glob_match("MI3??X", "MI300X"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a", ""));
    }

    #[test]
    fn versions() {
        assert_eq!(version_at_least("550.54.15", "550.54"), Some(true));
        assert_eq!(version_at_least("535.104", "550"), Some(false));
        assert_eq!(version_at_least("12.4", "12.4"), Some(true));
        assert_eq!(version_at_least("9.0", "8.9"), Some(true));
        assert_eq!(version_at_least("x", "1"), None);
    }

    #[test]
    fn label_keys() {
        assert!(valid_label_key("topology.kubernetes.io/zone"));
        assert!(valid_label_key("pool"));
        assert!(!valid_label_key("Bad Key"));
        assert!(!valid_label_key("/x"));
    }

    proptest! {
        #[test]
        fn bounded_names_are_valid_and_short(parts in proptest::collection::vec("[a-z0-9]{1,80}", 1..5), max in 20usize..253) {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let name = bounded(&refs, max);
            prop_assert!(name.len() <= max);
            prop_assert!(valid_dns_subdomain(&name), "{}", name);
        }

        #[test]
        fn slug_is_valid_label(raw in ".{1,60}") {
            let s = slug(&raw);
            prop_assert!(s.is_empty() || valid_label_value(&s));
        }
    }
}
