//! Image names and layer digests.

use crate::ImageError;

/// Longest image name.
pub const MAX_NAME: usize = 255;

/// Checks an image name: a path of lower-case segments (`base/python`), then optionally a tag
/// (`:3.12`) or a version (`@4f2a1c`).
pub fn check_name(name: &str) -> Result<(), ImageError> {
    let bad = |why: &str| {
        Err(ImageError::Invalid(format!(
            "image name {name:?} is not valid: {why}. Use lower-case letters, digits and . _ - \
             in /-separated parts, then optionally :tag or @version (e.g. base/python:3.12)"
        )))
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return bad(&format!("it must be 1 to {MAX_NAME} characters"));
    }
    let (repo, tag) = match name.find([':', '@']) {
        Some(i) => (&name[..i], Some(&name[i + 1..])),
        None => (name, None),
    };
    for part in repo.split('/') {
        let ok = !part.is_empty()
            && part.as_bytes()[0].is_ascii_alphanumeric()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !ok {
            return bad(&format!("part {part:?} of the name"));
        }
    }
    if repo == "host" {
        return bad("`host` is the built-in image");
    }
    if name == "stats" || name == "pull" {
        return bad("it is a route of the images API");
    }
    if let Some(tag) = tag {
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return bad(&format!("tag {tag:?}"));
        }
    }
    Ok(())
}

/// Checks a layer digest (`sha256:` and 64 lower-case hex digits) and returns its hex part.
pub fn check_digest(d: &str) -> Result<&str, ImageError> {
    match d.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(ImageError::Invalid(format!(
            "{d:?} is not a layer digest: expected sha256: and 64 hex digits"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "base/python:3.12",
            "ws/django@4f2a1c",
            "tk/swe-agent:v3",
            "check/busybox",
            "a",
        ] {
            check_name(ok).unwrap();
        }
        for bad in [
            "",
            "Base/python",
            "a//b",
            "/a",
            "a:",
            "a:b:c",
            "a b",
            "../x",
            "host",
            "stats",
            "a,b",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn digests() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(check_digest(&d).unwrap(), "a".repeat(64));
        assert!(check_digest("sha256:xyz").is_err());
        assert!(check_digest(&format!("sha512:{}", "a".repeat(64))).is_err());
    }
}
