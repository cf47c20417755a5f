//! The control plane's database: SQLite embedded in the control plane (the default), or
//! PostgreSQL shared by its replicas. One pool type serves both and every query is written
//! once, in what both speak: numbered `$N` parameters, `ON CONFLICT ... DO`, `RETURNING`.
//! Each has its own migrations (`migrations/sqlite`, `migrations/postgres`: the same tables
//! and columns, in each one's types).

/// A pool of connections to the database, whichever it is.
pub type Db = sqlx::AnyPool;

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `sqlite://PATH?mode=rwc` (or `sqlite::memory:`).
    Sqlite,
    /// `postgres://USER@HOST/DB` (or `postgresql://`).
    Postgres,
}

/// The kind of database `url` names, or why it names none Warren knows.
pub fn kind(url: &str) -> Result<Kind, String> {
    if url.starts_with("sqlite:") {
        Ok(Kind::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Kind::Postgres)
    } else {
        Err(format!(
            "database URL {:?} is neither sqlite:// nor postgres://",
            url.split('@').next_back().unwrap_or(url)
        ))
    }
}

/// Connects to `url` and brings its tables up to date.
pub async fn open(url: &str) -> Result<Db, sqlx::Error> {
    sqlx::any::install_default_drivers();
    let k = kind(url).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    if k == Kind::Sqlite {
        private_sqlite_files(url).map_err(sqlx::Error::Io)?;
    }
    let db = sqlx::any::AnyPoolOptions::new()
        .max_connections(match k {
            // One writer at a time in SQLite anyway.
            Kind::Sqlite => 4,
            Kind::Postgres => 16,
        })
        .acquire_timeout(std::time::Duration::from_secs(10))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if k == Kind::Sqlite {
                    // Write-ahead log, synced at checkpoints rather than at every commit: a
                    // crash of the process loses nothing, a power cut at most the last
                    // commits (keys of creates, a heartbeat). A commit per keyed create with
                    // a sync each held creates to ~550/s (`warren-bench cluster`). Replicas
                    // of one SQLite file wait for each other's writes up to 5 s.
                    sqlx::Executor::execute(&mut *conn, "PRAGMA journal_mode = WAL").await?;
                    sqlx::Executor::execute(&mut *conn, "PRAGMA synchronous = NORMAL").await?;
                    sqlx::Executor::execute(&mut *conn, "PRAGMA busy_timeout = 5000").await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?;
    match k {
        Kind::Sqlite => sqlx::migrate!("./migrations/sqlite").run(&db).await?,
        Kind::Postgres => sqlx::migrate!("./migrations/postgres").run(&db).await?,
    }
    Ok(db)
}

/// Makes an SQLite database's files readable by their owner only (mode 0600): they hold the
/// identities, key hashes and audit log. The database file is made so before SQLite opens it
/// (SQLite gives its `-wal` and `-shm` files the database file's mode), and files an earlier
/// version made with the process's umask are closed.
fn private_sqlite_files(url: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path.starts_with(':') || query.split('&').any(|q| q == "mode=memory") {
        return Ok(()); // in memory
    }
    // Nothing of the database is a link (the data directory is its owner's alone, so none
    // should be): its mode would be set, and SQLite would write, through it.
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let p = format!("{path}{suffix}");
        if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(std::io::Error::other(format!(
                "the database file {p} is a symbolic link: remove it, or name the real file in \
                 the database URL"
            )));
        }
    }
    if query.split('&').any(|q| q == "mode=rwc") {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let p = format!("{path}{suffix}");
        match std::fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?
            }
            _ => {}
        }
    }
    Ok(())
}

/// Begins a transaction that will write. On SQLite it takes the write lock at once (`BEGIN
/// IMMEDIATE`): a deferred transaction that reads and then writes cannot wait for another
/// writer (SQLite answers "database is locked" at once rather than risk a deadlock), while
/// one that starts as a writer waits its turn up to the busy timeout.
pub async fn begin_write(db: &Db) -> Result<sqlx::Transaction<'static, sqlx::Any>, sqlx::Error> {
    if db.connect_options().database_url.scheme() == "sqlite" {
        db.begin_with("BEGIN IMMEDIATE").await
    } else {
        db.begin().await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// The database and its write-ahead files are their owner's alone, whatever the umask,
    /// and files an earlier version left readable are closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("w.db");
        let mode = |s: &str| {
            std::fs::metadata(format!("{}{s}", path.display()))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let db = super::open(&url).await.unwrap();
        sqlx::query("CREATE TABLE m (n BIGINT)")
            .execute(&db)
            .await
            .unwrap();
        assert_eq!(
            (mode(""), mode("-wal"), mode("-shm")),
            (0o600, 0o600, 0o600)
        );
        db.close().await;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let db = super::open(&url).await.unwrap();
        assert_eq!(mode(""), 0o600);
        db.close().await;
    }

    /// Two SQLite writers that both read first: the second waits for the first instead of
    /// failing. (PostgreSQL's writers to different rows do not wait for each other at all.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_that_reads_first_waits_for_another_writer() {
        {
            let t = super::testing::sqlite().await;
            let db = &t.db;
            sqlx::query("CREATE TABLE w (n BIGINT)")
                .execute(db)
                .await
                .unwrap();
            let mut first = super::begin_write(db).await.unwrap();
            sqlx::query("INSERT INTO w (n) VALUES (1)")
                .execute(&mut *first)
                .await
                .unwrap();
            let second = {
                let db = db.clone();
                tokio::spawn(async move {
                    let mut tx = super::begin_write(&db).await?;
                    let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM w")
                        .fetch_one(&mut *tx)
                        .await?;
                    sqlx::query("INSERT INTO w (n) VALUES ($1)")
                        .bind(n + 10)
                        .execute(&mut *tx)
                        .await?;
                    tx.commit().await
                })
            };
            // The second is held up while the first writes, then goes on.
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!second.is_finished());
            first.commit().await.unwrap();
            second.await.unwrap().unwrap();
            let (sum,): (i64,) = sqlx::query_as("SELECT SUM(n) FROM w")
                .fetch_one(db)
                .await
                .unwrap();
            assert_eq!(sum, 12, "the second saw the first's row");
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! The databases the control plane's own tests run on: SQLite always, PostgreSQL where
    //! its programs are installed (`make test` installs them), each fresh.

    /// A fresh database; a PostgreSQL server stops before its directory goes (fields drop in
    /// order).
    pub(crate) struct TestDb {
        pub(crate) db: super::Db,
        _pg: Option<crate::local_pg::LocalPostgres>,
        _dir: tempfile::TempDir,
    }

    /// A fresh SQLite database.
    pub(crate) async fn sqlite() -> TestDb {
        let d = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", d.path().join("t.db").display());
        TestDb {
            db: super::open(&url).await.unwrap(),
            _pg: None,
            _dir: d,
        }
    }

    /// A fresh database of each kind this machine has.
    pub(crate) async fn each() -> Vec<TestDb> {
        let mut out = vec![sqlite().await];
        match crate::local_pg::binaries() {
            Ok(_) => {
                let d = tempfile::Builder::new()
                    .prefix("warren-pg-")
                    .tempdir()
                    .unwrap();
                let path = d.path().to_path_buf();
                let pg = tokio::task::spawn_blocking(move || {
                    crate::local_pg::LocalPostgres::start(&path)
                })
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("PostgreSQL is installed but does not start: {e}"));
                out.push(TestDb {
                    db: super::open(&pg.url).await.unwrap(),
                    _pg: Some(pg),
                    _dir: d,
                });
            }
            Err(why) => eprintln!("database tests on SQLite only: {why}"),
        }
        out
    }
}
