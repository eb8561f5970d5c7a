//! What may be said about a remote URL: its printable form (userinfo removed, since forges
//! accept a token as the user name as well as the password) and the name of its mirror
//! directory under the state directory.
//!
//! Both work on the text as configured, without parsing it as a git URL, so they also apply to
//! URLs that gix rejects (whose error text must not carry credentials either).

/// `url` without any `user[:password]@` part, fit for logs and error messages.
pub(crate) fn redact_userinfo(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        return match authority.rfind('@') {
            Some(at) => format!("{scheme}://{}{path}", &authority[at + 1..]),
            None => url.to_owned(),
        };
    }
    // scp-like `user@host:path`; a local path has a `/` before any `:`.
    if let Some(colon) = url.find(':')
        && !url[..colon].contains('/')
        && let Some(at) = url[..colon].rfind('@')
    {
        return url[at + 1..].to_owned();
    }
    url.to_owned()
}

/// Whether `url` carries a password (`scheme://user:password@host/...`).
pub(crate) fn has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    authority
        .rfind('@')
        .is_some_and(|at| authority[..at].contains(':'))
}

/// The mirror directory name for `url`: a readable slug of the redacted URL and a stable
/// 64-bit FNV-1a hash of it, so that two URLs never share a mirror and a changed URL gets a
/// fresh one.
pub(crate) fn mirror_dir_name(url: &str) -> String {
    let redacted = redact_userinfo(url);
    let without_scheme = redacted
        .split_once("://")
        .map_or(redacted.as_str(), |(_, rest)| rest);
    let mut slug: String = without_scheme
        .trim_end_matches('/')
        .trim_end_matches(".git")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = slug.trim_matches(['-', '.']).len();
    if trimmed == 0 {
        slug = "repo".to_owned();
    } else {
        slug = slug.trim_matches(['-', '.']).to_owned();
    }
    slug.truncate(60);
    format!("{slug}-{:016x}.git", fnv1a64(redacted.as_bytes()))
}

/// FNV-1a: tiny and stable across Rust releases (unlike `DefaultHasher`), which a directory
/// name that must survive upgrades needs.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacting_removes_user_and_password_from_urls() {
        assert_eq!(
            redact_userinfo("https://git:s3cret@git.example.org/ops.git"),
            "https://git.example.org/ops.git"
        );
        assert_eq!(
            redact_userinfo("https://TOKEN@git.example.org:8443/a/b.git"),
            "https://git.example.org:8443/a/b.git"
        );
        assert_eq!(
            redact_userinfo("ssh://git@git.example.org/ops.git"),
            "ssh://git.example.org/ops.git"
        );
        assert_eq!(
            redact_userinfo("git@git.example.org:ops.git"),
            "git.example.org:ops.git"
        );
    }

    #[test]
    fn redacting_leaves_urls_without_userinfo_alone() {
        for url in [
            "https://git.example.org/ops.git",
            "file:///srv/git/ops@2.git",
            "/srv/git/a@b:c.git",
            "git://127.0.0.1:9418/ops.git",
        ] {
            assert_eq!(redact_userinfo(url), url);
        }
    }

    #[test]
    fn a_password_in_the_authority_is_detected() {
        assert!(has_password("https://git:tok@host/ops.git"));
        assert!(!has_password("https://tok@host/ops.git"));
        assert!(!has_password("https://host:443/ops.git"));
        assert!(!has_password("ssh://git@host:22/ops.git"));
        assert!(!has_password("git@host:ops.git"));
    }

    #[test]
    fn mirror_names_are_readable_stable_and_free_of_credentials() {
        let name = mirror_dir_name("https://git:tok@git.example.org/ops.git");
        assert!(
            name.starts_with("git.example.org-ops-") && name.ends_with(".git"),
            "{name}"
        );
        assert!(!name.contains("tok"));
        assert_eq!(name, mirror_dir_name("https://git.example.org/ops.git"));
        assert_ne!(name, mirror_dir_name("https://git.example.org/ops2.git"));
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn mirror_names_of_odd_urls_are_still_usable_directory_names() {
        let name = mirror_dir_name("file:///");
        assert!(name.starts_with("repo-"), "{name}");
        assert!(!mirror_dir_name("file:///srv/../x.git").contains('/'));
    }
}
