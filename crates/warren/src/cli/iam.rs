//! `warren project|identity|key|grant|revoke|whoami|audit`: who may do what where.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use warren_sdk::{ByteSize, Client, CreateIdentity, CreateKey, ProjectQuota};

use super::output;

/// `warren project` commands.
#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project under an existing one (needs project.admin on the parent).
    #[command(after_help = "Examples:\n  warren project create root/rl\n  \
        warren project create root/rl/job-42")]
    Create {
        /// Its path: root, then segments of lowercase letters, digits, - _ .
        path: String,
    },
    /// List the projects this key may see.
    #[command(
        visible_alias = "list",
        after_help = "Examples:\n  warren project ls\n  warren project ls --json"
    )]
    Ls,
    /// Delete a project (refused while it has child projects, identities or sandboxes).
    #[command(after_help = "Examples:\n  warren project rm root/rl/job-42\n  \
        warren project rm root/rl/job-42 --force   # kills its sandboxes first")]
    Rm {
        /// Its path.
        path: String,
        /// Kill its sandboxes first.
        #[arg(long)]
        force: bool,
    },
    /// Set a project's quotas, counted over it and everything below it. Each call sets all of
    /// them: a limit not given is no limit.
    #[command(after_help = "Examples:\n  \
        warren project quota root/rl/job-42 --max-sandboxes 1000 --max-cpu 64000 --max-memory 256Gi\n  \
        warren project quota root/rl/judge --max-sandboxes 10 --max-fncalls 64\n  \
        warren project quota root/rl/job-42          # no limits of its own")]
    Quota {
        /// Its path.
        path: String,
        /// Most sandboxes at once.
        #[arg(long, value_name = "N")]
        max_sandboxes: Option<u64>,
        /// Most CPU requested, millicores.
        #[arg(long, value_name = "MILLICORES")]
        max_cpu: Option<u64>,
        /// Most memory requested, e.g. 256Gi.
        #[arg(long, value_name = "SIZE")]
        max_memory: Option<ByteSize>,
        /// Most function calls in flight at once.
        #[arg(long, value_name = "N")]
        max_fncalls: Option<u64>,
    },
}

/// `warren identity` commands.
#[derive(Debug, Subcommand)]
pub enum IdentityCommand {
    /// Create an identity (needs iam.delegate where it is made).
    #[command(
        after_help = "Examples:\n  warren identity create job-42-bot --project root/rl/job-42\n  \
        warren identity create alice --kind user --project root/rl"
    )]
    Create {
        /// Its name: lowercase letters, digits, - _ . @
        name: String,
        /// user or service.
        #[arg(long, default_value = "service", value_parser = ["user", "service"])]
        kind: String,
        /// Where it is made [default: this key's project].
        #[arg(long, value_name = "PATH")]
        project: Option<String>,
    },
    /// List the identities this key manages.
    #[command(visible_alias = "list", after_help = "Examples:\n  warren identity ls")]
    Ls,
}

/// `warren key` commands.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Make a key; prints its secret once.
    #[command(after_help = "Examples:\n  \
        warren key create --name job-42 --project root/rl/job-42 --role runner\n  \
        warren key create --name bot --identity job-42-bot --project root/rl/job-42 --expires-in 86400\n\n\
        Roles: viewer, runner, builder, project-admin, admin (or one permission, e.g. sandbox.exec). \
        The key may do what its role allows and its identity holds; you must hold the role's \
        permissions there yourself.")]
    Create(KeyCreateArgs),
    /// List the keys this key manages (never their secrets).
    #[command(visible_alias = "list", after_help = "Examples:\n  warren key ls")]
    Ls,
    /// Revoke a key: every replica refuses it within a second or two.
    #[command(after_help = "Examples:\n  warren key revoke key_1a2b3c4d5e6f")]
    Revoke {
        /// Its id (key_...).
        id: String,
    },
}

/// Options of `key create`.
#[derive(Debug, Args)]
pub struct KeyCreateArgs {
    /// A name for lists [default: the project's last segment, or the key's own project's].
    #[arg(long)]
    name: Option<String>,
    /// The project subtree it acts in [default: this key's project].
    #[arg(long, value_name = "PATH")]
    project: Option<String>,
    /// Its role or permission.
    #[arg(long, default_value = "runner")]
    role: String,
    /// The identity it acts as [default: this key's].
    #[arg(long, value_name = "NAME")]
    identity: Option<String>,
    /// Seconds until it expires [default: never].
    #[arg(long, value_name = "SECONDS")]
    expires_in: Option<u64>,
    /// The secret's form: warren (wrn_...) or e2b (e2b_ + 40 hex, for E2B SDKs through the
    /// gateway).
    #[arg(long, default_value = "warren", value_parser = ["warren", "e2b"])]
    form: String,
}

/// Options of `grant` and `revoke`.
#[derive(Debug, Args)]
pub struct GrantArgs {
    /// The identity.
    identity: String,
    /// The project (its whole subtree).
    #[arg(long, value_name = "PATH")]
    project: String,
    /// A role (viewer, runner, builder, project-admin, admin) or a permission.
    #[arg(long)]
    role: String,
}

/// Options of `audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Most records.
    #[arg(long, default_value_t = 100)]
    limit: u64,
}

fn time(s: &Option<String>) -> String {
    s.clone().unwrap_or_else(|| "-".into())
}

/// Runs `warren project`.
pub async fn project(client: &Client, json: bool, cmd: ProjectCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ProjectCommand::Create { path } => {
            let p = client.create_project(&path).await?;
            if json {
                output::json(&p)?;
            } else {
                println!("{}", p.path);
            }
        }
        ProjectCommand::Ls => {
            let l = client.projects().await?;
            if json {
                output::json(&l)?;
            } else {
                let mut t = output::table(&[
                    "PROJECT",
                    "MAX SANDBOXES",
                    "MAX CPU",
                    "MAX MEMORY",
                    "MAX FNCALLS",
                    "CREATED BY",
                ]);
                for p in &l {
                    t.add_row([
                        p.path.clone(),
                        p.max_sandboxes.map_or("-".into(), |v| v.to_string()),
                        p.max_cpu.map_or("-".into(), |v| format!("{v}m")),
                        p.max_memory.map_or("-".into(), |v| ByteSize(v).to_string()),
                        p.max_fncalls.map_or("-".into(), |v| v.to_string()),
                        p.created_by.clone(),
                    ]);
                }
                output::print(&t);
            }
        }
        ProjectCommand::Rm { path, force } => {
            client.delete_project(&path, force).await?;
            println!("{path}");
        }
        ProjectCommand::Quota {
            path,
            max_sandboxes,
            max_cpu,
            max_memory,
            max_fncalls,
        } => {
            client
                .set_quota(
                    &path,
                    &ProjectQuota {
                        max_sandboxes,
                        max_cpu,
                        max_memory,
                        max_fncalls,
                    },
                )
                .await?;
            println!("{path}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `warren identity`.
pub async fn identity(
    client: &Client,
    json: bool,
    cmd: IdentityCommand,
) -> anyhow::Result<ExitCode> {
    match cmd {
        IdentityCommand::Create {
            name,
            kind,
            project,
        } => {
            let i = client
                .create_identity(&CreateIdentity {
                    name,
                    kind: Some(kind),
                    project,
                })
                .await?;
            if json {
                output::json(&i)?;
            } else {
                println!("{}", i.name);
            }
        }
        IdentityCommand::Ls => {
            let l = client.identities().await?;
            let b = client.bindings().await?;
            if json {
                output::json(&serde_json::json!({"identities": l, "bindings": b}))?;
            } else {
                let mut t = output::table(&["IDENTITY", "KIND", "PROJECT", "GRANTS"]);
                for i in &l {
                    let grants: Vec<String> = b
                        .iter()
                        .filter(|g| g.identity == i.name)
                        .map(|g| format!("{} on {}", g.grant, g.project))
                        .collect();
                    t.add_row([
                        i.name.clone(),
                        i.kind.clone(),
                        i.project.clone(),
                        grants.join(", "),
                    ]);
                }
                output::print(&t);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `warren key`.
pub async fn key(client: &Client, json: bool, cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeyCommand::Create(a) => {
            let name = a.name.unwrap_or_else(|| {
                a.project
                    .as_deref()
                    .and_then(|p| p.rsplit('/').next())
                    .unwrap_or("key")
                    .to_string()
            });
            let k = client
                .create_key(&CreateKey {
                    name,
                    identity: a.identity,
                    project: a.project,
                    role: Some(a.role),
                    expires_in: a.expires_in,
                    form: Some(a.form),
                })
                .await?;
            if json {
                output::json(&k)?;
            } else {
                eprintln!(
                    "key {} ({} as {} on {}): keep the secret now, it is not shown again",
                    k.key.id, k.key.role, k.key.identity, k.key.project
                );
                println!("{}", k.secret);
            }
        }
        KeyCommand::Ls => {
            let l = client.keys().await?;
            if json {
                output::json(&l)?;
            } else {
                let mut t = output::table(&[
                    "ID",
                    "NAME",
                    "IDENTITY",
                    "PROJECT",
                    "ROLE",
                    "EXPIRES",
                    "REVOKED",
                    "LAST USED",
                ]);
                for k in &l {
                    t.add_row([
                        k.id.clone(),
                        k.name.clone(),
                        k.identity.clone(),
                        k.project.clone(),
                        k.role.clone(),
                        time(&k.expires_at),
                        time(&k.revoked_at),
                        time(&k.last_used_at),
                    ]);
                }
                output::print(&t);
            }
        }
        KeyCommand::Revoke { id } => {
            let k = client.revoke_key(&id).await?;
            println!("{} revoked", k.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `warren grant` (`on`) or `warren revoke`.
pub async fn grant(
    client: &Client,
    json: bool,
    a: GrantArgs,
    on: bool,
) -> anyhow::Result<ExitCode> {
    if on {
        let b = client.grant(&a.identity, &a.project, &a.role).await?;
        if json {
            output::json(&b)?;
        } else {
            println!("{} holds {} on {}", b.identity, b.grant, b.project);
        }
    } else {
        client
            .revoke_grant(&a.identity, &a.project, &a.role)
            .await?;
        println!("{} no longer holds {} on {}", a.identity, a.role, a.project);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `warren whoami`.
pub async fn whoami(client: &Client, json: bool) -> anyhow::Result<ExitCode> {
    let w = client.whoami().await?;
    if json {
        output::json(&w)?;
    } else {
        println!("{} (key {}) in {}", w.identity, w.key_id, w.project);
        for g in &w.grants {
            println!("  {}: {}", g.project, g.permissions.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `warren audit`.
pub async fn audit(client: &Client, json: bool, a: AuditArgs) -> anyhow::Result<ExitCode> {
    let l = client.audit(None, Some(a.limit)).await?;
    if json {
        output::json(&l.entries)?;
    } else {
        let mut t = output::table(&["AT", "ACTOR", "ACTION", "TARGET", "PROJECT", "DETAIL"]);
        for e in &l.entries {
            t.add_row([
                e.at.clone(),
                e.actor.clone(),
                e.action.clone(),
                e.target.clone(),
                time(&e.project),
                time(&e.detail),
            ]);
        }
        output::print(&t);
    }
    Ok(ExitCode::SUCCESS)
}
