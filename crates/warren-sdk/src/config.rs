//! Where the client finds Warren and its API key.
//!
//! | setting | from | default |
//! |---|---|---|
//! | address | `WARREN_URL` | `http://127.0.0.1:7700` |
//! | API key | `WARREN_API_KEY`, else the file `<data-dir>/admin.key` | none |
//! | data dir | `WARREN_DATA_DIR` | `/var/lib/warren` |
//!
//! `warren up` writes the admin key to `<data-dir>/admin.key`, so on the machine that runs it
//! (and as a user who may read that file) no configuration is needed at all.

use std::path::{Path, PathBuf};

/// The address a client uses when none is configured: `warren up`'s default.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7700";
/// The data directory `warren up` uses when none is configured.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/warren";
/// Name of the admin key file in the data directory.
pub const KEY_FILE: &str = "admin.key";

/// How to reach Warren: its address and the API key to send.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Base address of the REST API, e.g. `http://127.0.0.1:7700`.
    pub url: String,
    /// API key sent as `Authorization: Bearer <key>`; `None` sends none.
    pub api_key: Option<String>,
    /// Why there is no key, told to the user when the server asks for one.
    missing_key: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Config {
    /// A configuration with this address and key.
    pub fn new(url: impl Into<String>, api_key: Option<String>) -> Config {
        let missing_key = api_key
            .is_none()
            .then(|| "no API key was given to the client".to_string());
        Config {
            url: url.into(),
            api_key,
            missing_key,
        }
    }

    /// The configuration from the environment (see the [module docs](self)).
    ///
    /// Never fails: a missing key only matters once a request needs one, and the error then
    /// says where the key was looked for.
    pub fn from_env() -> Config {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let url = var("WARREN_URL").unwrap_or_else(|| DEFAULT_URL.to_string());
        if let Some(key) = var("WARREN_API_KEY") {
            return Config::new(url, Some(key.trim().to_string()));
        }
        let data_dir = var("WARREN_DATA_DIR").unwrap_or_else(|| DEFAULT_DATA_DIR.to_string());
        let (api_key, missing_key) = match read_key_file(&key_file(Path::new(&data_dir))) {
            Ok(key) => (Some(key), None),
            Err(why) => (None, Some(format!("WARREN_API_KEY is not set and {why}"))),
        };
        Config {
            url,
            api_key,
            missing_key,
        }
    }

    /// Why no key is configured, when none is: where it was looked for.
    pub fn missing_key_reason(&self) -> Option<&str> {
        match self.api_key {
            Some(_) => None,
            None => Some(
                self.missing_key
                    .as_deref()
                    .unwrap_or("no API key was given to the client"),
            ),
        }
    }
}

impl Default for Config {
    /// [`Config::from_env`].
    fn default() -> Self {
        Config::from_env()
    }
}

/// The admin key file in a data directory.
pub fn key_file(data_dir: &Path) -> PathBuf {
    data_dir.join(KEY_FILE)
}

/// Reads a key file; the error says, in words, why no key came from it.
fn read_key_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{} does not exist", path.display()),
        std::io::ErrorKind::PermissionDenied => {
            format!("{} is not readable by this user", path.display())
        }
        _ => format!("{} could not be read ({e})", path.display()),
    })?;
    let key = text.trim();
    if key.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_file_is_read_and_trimmed() {
        let dir = std::env::temp_dir().join(format!("warren-sdk-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = key_file(&dir);
        assert_eq!(path, dir.join("admin.key"));

        let err = read_key_file(&path).unwrap_err();
        assert!(err.ends_with("admin.key does not exist"), "{err}");
        std::fs::write(&path, "  \n").unwrap();
        assert!(read_key_file(&path).unwrap_err().ends_with("is empty"));
        std::fs::write(&path, "wk_secret\n").unwrap();
        assert_eq!(read_key_file(&path).unwrap(), "wk_secret");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_output_hides_the_key() {
        let cfg = Config::new("http://h:1", Some("wk_secret".into()));
        assert!(!format!("{cfg:?}").contains("wk_secret"));
        assert_eq!(cfg.missing_key_reason(), None);
        let cfg = Config::new("http://h:1", None);
        assert!(cfg.missing_key_reason().is_some());
    }
}
