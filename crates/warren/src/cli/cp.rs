//! `warren cp`: copy a file or a directory into a sandbox (`cp SRC ID:DST`) or out of one
//! (`cp ID:SRC DST`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_sdk::{Client, FileKind, Sandbox, SandboxId};

use super::output;

/// Options of `warren cp`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    warren cp ./train.py $id:/home/user/train.py    # upload\n  \
    warren cp ./train.py $id:/tmp/                  # into a directory, keeping the name\n  \
    warren cp $id:/tmp/out.json ./out.json          # download\n  \
    warren cp $id:/var/log/app.log - | tail         # download to standard output\n  \
    tar -czf - src | warren cp - $id:/tmp/src.tgz   # upload standard input\n  \
    warren cp ./src $id:/home/user/src              # a directory, as cp -r\n  \
    warren cp $id:/home/user/out ./out              # a directory out\n\n\
    One side is ID:PATH (ID is the sandbox's 20-character id), the other a local path or -.\n\
    A relative sandbox PATH is relative to the user's home. A local path that looks like\n\
    ID:PATH can be written ./ID:PATH. Uploads keep the local file's permission bits.\n\
    A directory is copied with its contents, as cp -r: into DST under its own name when DST\n\
    is an existing directory, else as DST.")]
pub struct CpArgs {
    /// What to copy: a local file or directory, - for standard input, or ID:PATH in a sandbox.
    #[arg(value_name = "SRC")]
    src: String,
    /// Where to: ID:PATH in a sandbox, or a local path, - for standard output.
    #[arg(value_name = "DST")]
    dst: String,
    /// Act as this user in the sandbox (uploaded files belong to them) [default: user].
    #[arg(long, short = 'u', value_name = "USER")]
    user: Option<String>,
}

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
pub enum Location<'a> {
    /// A path on this machine, or `-`.
    Local(&'a str),
    /// A path in a sandbox.
    Remote(SandboxId, &'a str),
}

/// Reads `ID:PATH` as a sandbox path when what is before the first `:` is a valid sandbox
/// id; anything else (`./a:b`, `C:x`, `notes:v2.txt`) is a local path.
pub fn location(s: &str) -> Location<'_> {
    match s.split_once(':') {
        Some((id, path)) => match id.parse::<SandboxId>() {
            Ok(id) => Location::Remote(id, path),
            Err(_) => Location::Local(s),
        },
        None => Location::Local(s),
    }
}

/// Runs `warren cp`: an upload or a download, by which side is `ID:PATH`.
pub async fn run(client: &Client, json: bool, a: CpArgs) -> anyhow::Result<ExitCode> {
    match (location(&a.src), location(&a.dst)) {
        (Location::Local(src), Location::Remote(id, dst)) => {
            let sb = sandbox(client, &id, a.user.as_deref())?;
            let entry = upload(&sb, src, remote_path(dst, &a.dst)?).await?;
            if json {
                output::json(&entry)?;
            }
        }
        (Location::Remote(id, src), Location::Local(dst)) => {
            let sb = sandbox(client, &id, a.user.as_deref())?;
            let (path, bytes) = download(&sb, remote_path(src, &a.src)?, dst).await?;
            if json {
                output::json(&serde_json::json!({ "path": path, "bytes": bytes }))?;
            }
        }
        (Location::Remote(..), Location::Remote(..)) => bail!(
            "both {} and {} are in sandboxes: copy to this machine first, then to the other sandbox",
            a.src,
            a.dst
        ),
        (Location::Local(_), Location::Local(_)) => bail!(
            "neither {} nor {} is in a sandbox: write one side as ID:PATH, with the id that \
             `warren sandbox create` printed (e.g. {}:/tmp/file)",
            a.src,
            a.dst,
            "n7k2q9x0c4m1z7p4w6ab"
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn sandbox(client: &Client, id: &SandboxId, user: Option<&str>) -> anyhow::Result<Sandbox> {
    let sb = client.sandbox(id.as_str())?;
    Ok(match user {
        Some(u) => sb.as_user(u),
        None => sb,
    })
}

fn remote_path<'a>(path: &'a str, whole: &str) -> anyhow::Result<&'a str> {
    if path.is_empty() {
        bail!("{whole} names no path in the sandbox: write ID:/path/to/file");
    }
    Ok(path)
}

/// Uploads `src` (a file, or `-` for stdin) to `dst`; into `dst` when it is a directory.
async fn upload(sb: &Sandbox, src: &str, dst: &str) -> anyhow::Result<warren_sdk::FileEntry> {
    if src == "-" {
        let mut data = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut data)
            .await
            .context("reading standard input")?;
        return Ok(sb.write_file(dst, data).await?);
    }
    let meta = std::fs::metadata(src).with_context(|| format!("cannot read {src}"))?;
    let name = Path::new(src)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if meta.is_dir() {
        // As `cp -r`: into an existing directory under the source's name, else as `dst`.
        let target = if is_remote_dir(sb, dst).await && !name.is_empty() && name != ".." {
            format!("{}/{name}", dst.trim_end_matches('/'))
        } else {
            dst.to_string()
        };
        sb.upload_dir(src, &target).await?;
        return Ok(sb.stat(&target).await?);
    }
    let target = if dst.ends_with('/') || is_remote_dir(sb, dst).await {
        format!("{}/{name}", dst.trim_end_matches('/'))
    } else {
        dst.to_string()
    };
    Ok(sb.upload_file(src, &target, Some(mode_of(&meta))).await?)
}

/// Whether `path` is a directory in the sandbox; `false` when it does not exist (or cannot
/// be looked at: the upload then reports why).
async fn is_remote_dir(sb: &Sandbox, path: &str) -> bool {
    matches!(sb.stat(path).await, Ok(e) if e.kind == FileKind::Dir)
}

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o777
}

#[cfg(not(unix))]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    if meta.permissions().readonly() {
        0o444
    } else {
        0o644
    }
}

/// Downloads `src` to `dst` (`-` for stdout; into `dst` when it is a local directory).
/// Returns where it went and how many bytes.
async fn download(sb: &Sandbox, src: &str, dst: &str) -> anyhow::Result<(String, u64)> {
    if dst == "-" {
        let mut stream = sb.read_file_stream(src).await?;
        let mut out = tokio::io::stdout();
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            match out.write_all(&chunk).await {
                // The reader has seen enough (`| head`): not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
                res => res.context("writing to standard output")?,
            }
            n += chunk.len() as u64;
        }
        match out.flush().await {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            res => res.context("writing to standard output")?,
        }
        return Ok(("-".into(), n));
    }
    let mut target = PathBuf::from(dst);
    if is_remote_dir(sb, src).await {
        // As `cp -r`: into an existing directory under the source's name, else as `dst`.
        if target.is_dir() {
            let name = src
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or_default();
            if !name.is_empty() && name != "." && name != ".." {
                target.push(name);
            }
        }
        let n = sb.download_dir(src, &target).await?;
        return Ok((target.display().to_string(), n));
    }
    if dst.ends_with('/') || target.is_dir() {
        let name = src
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default();
        if name.is_empty() || name == "." || name == ".." {
            bail!("{src} names no file to copy into the directory {dst}: give a file name");
        }
        target.push(name);
    }
    let n = sb.download_file(src, &target).await?;
    Ok((target.display().to_string(), n))
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use super::*;

    const ID: &str = "abcdef0123456789wxyz";

    fn id() -> SandboxId {
        ID.parse().unwrap()
    }

    #[test]
    fn id_colon_path_is_a_sandbox_path() {
        assert_eq!(
            location("abcdef0123456789wxyz:/tmp/x"),
            Location::Remote(id(), "/tmp/x")
        );
        assert_eq!(
            location("abcdef0123456789wxyz:rel/a:b"),
            Location::Remote(id(), "rel/a:b")
        );
        assert_eq!(
            location("abcdef0123456789wxyz:"),
            Location::Remote(id(), "")
        );
    }

    #[test]
    fn anything_else_is_a_local_path() {
        for local in [
            "/tmp/x",
            "-",
            "notes:v2.txt",
            "./abcdef0123456789wxyz:/tmp/x",
            "ABCDEF0123456789WXYZ:/tmp/x",
            "abcdef0123456789wxy:/tmp/x",
            "abcdef0123456789wxyz0:/tmp/x",
            "1bcdef0123456789wxyz:/tmp/x",
            "C:\\data",
            "",
        ] {
            assert_eq!(location(local), Location::Local(local), "{local}");
        }
    }

    #[test]
    fn an_empty_sandbox_path_is_refused() {
        assert!(
            remote_path("", "x:")
                .unwrap_err()
                .to_string()
                .contains("names no path")
        );
        assert_eq!(remote_path("/a", "x:/a").unwrap(), "/a");
    }

    #[test]
    fn cp_takes_two_operands_and_a_user() {
        let cli = parse(&["cp", "-u", "root", "./a", "abcdef0123456789wxyz:/b"]).unwrap();
        match cli.command {
            super::super::Command::Cp(a) => {
                assert_eq!(a.user.as_deref(), Some("root"));
                assert_eq!(location(&a.dst), Location::Remote(id(), "/b"));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["cp", "./a"]).is_err());
    }
}
