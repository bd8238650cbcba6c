//! Text that may reach a log, an error or an API answer, made safe to show.

/// `url` as it may be shown (logs, errors, API answers, `/metrics` labels): a password in
/// its user-info replaced by `***` (the user name kept: `http://user:***@host/hook`), tabs
/// and line breaks dropped (the URL standard drops them too, so they are not part of the
/// address). Anything else is kept as written, also when `url` does not parse: the
/// user-info is what precedes the last `@` of the authority, the password what follows its
/// first `:`, as the URL standard reads them (WHATWG URL, "authority state"). A request
/// still goes to the real URL; this is for showing it only.
pub fn redact_url(url: &str) -> String {
    let cleaned: String = url
        .trim()
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    // The authority follows `scheme://`; without it (a malformed value) the whole string
    // is read as one, so `user:pass@host` is still hidden.
    let start = match cleaned.split_once(':') {
        Some((scheme, rest)) if rest.starts_with("//") => scheme.len() + 3,
        _ => 0,
    };
    let rest = &cleaned[start..];
    let authority = &rest[..rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len())];
    let Some(at) = authority.rfind('@') else {
        return cleaned;
    };
    let Some(colon) = authority[..at].find(':') else {
        return cleaned;
    };
    format!(
        "{}***{}",
        &cleaned[..start + colon + 1],
        &cleaned[start + at..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_hidden_and_the_rest_kept() {
        for (url, shown) in [
            ("http://user:pass@host/hook", "http://user:***@host/hook"),
            (
                "https://u:p@w@h.example:8443/x?q=a:b@c#f",
                "https://u:***@h.example:8443/x?q=a:b@c#f",
            ),
            ("http://:pass@host/", "http://:***@host/"),
            ("http://user@host/hook", "http://user@host/hook"),
            ("http://host:8080/a@b:c", "http://host:8080/a@b:c"),
            ("http://host/?u=a:b@c", "http://host/?u=a:b@c"),
            (" http://us\ter:pa\nss@host/ ", "http://user:***@host/"),
            ("user:pass@host", "user:***@host"),
            ("/relative/path", "/relative/path"),
            (
                "http://fwduser:fwdpass@up.example:4318",
                "http://fwduser:***@up.example:4318",
            ),
            ("http://h:4318", "http://h:4318"),
        ] {
            assert_eq!(redact_url(url), shown, "{url:?}");
        }
    }
}
