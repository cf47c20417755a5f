//! `warren network ...`: what a sandbox (or every sandbox of a task) may reach, read and
//! changed at run time; and the policy flags `sandbox create` shares.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use warren_sdk::{Client, NetRule, NetworkMode, NetworkPolicy, NetworkStatus, Protocol};

use super::output;

/// Policy flags: `--allow-*`, `--deny-*`, `--none`, `--internet`.
#[derive(Debug, Args, Default)]
pub struct PolicyArgs {
    /// Allow TCP to a domain's addresses, as the node's resolver gives them to the sandbox:
    /// `pypi.org`, or `*.pythonhosted.org` for every name under it (repeatable).
    #[arg(long = "allow-domain", value_name = "DOMAIN")]
    allow_domain: Vec<String>,
    /// Allow every protocol and port to an address or CIDR: `203.0.113.0/24`, `2001:db8::/32` (private ranges only where the node's operator exempts them)
    /// (repeatable).
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    allow_cidr: Vec<String>,
    /// Allow a port or range on every address: `443`, `53/udp`, `8000-8100/tcp` (repeatable;
    /// without a protocol, TCP and UDP).
    #[arg(long = "allow-port", value_name = "PORT[/PROTO]")]
    allow_port: Vec<String>,
    /// Refuse a domain even where an allow rule matches (repeatable).
    #[arg(long = "deny-domain", value_name = "DOMAIN")]
    deny_domain: Vec<String>,
    /// Refuse a CIDR even where an allow rule matches (repeatable).
    #[arg(long = "deny-cidr", value_name = "CIDR")]
    deny_cidr: Vec<String>,
    /// Refuse a port on every address even where an allow rule matches (repeatable).
    #[arg(long = "deny-port", value_name = "PORT[/PROTO]")]
    deny_port: Vec<String>,
    /// No network: at create, loopback only (no interface at all); at run time, everything
    /// denied (the interface stays).
    #[arg(long, conflicts_with_all = ["internet", "allow_domain", "allow_cidr", "allow_port", "deny_domain", "deny_cidr", "deny_port", "expose"])]
    none: bool,
    /// Allow every public address, every port: every address outside the always-denied ones
    /// (the node, other sandboxes, the control plane, private networks, loopback, link-local
    /// and metadata addresses).
    #[arg(long)]
    internet: bool,
    /// Make a TCP port of the sandbox reachable from outside it (repeatable): the node gives
    /// it a port on its host, shown as `exposed`. A service must listen on 0.0.0.0 or ::.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    expose: Vec<u16>,
}

fn port_rule(spec: &str) -> Result<NetRule, String> {
    let (ports, protocol) = match spec.split_once('/') {
        Some((p, "tcp")) => (p, Some(Protocol::Tcp)),
        Some((p, "udp")) => (p, Some(Protocol::Udp)),
        Some((_, other)) => {
            return Err(format!(
                "port {spec:?}: protocol {other:?} is not tcp or udp (write 443/tcp or 53/udp)"
            ));
        }
        None => (spec, None),
    };
    Ok(NetRule {
        ports: Some(ports.to_string()),
        protocol,
        ..NetRule::default()
    })
}

impl PolicyArgs {
    /// Whether any flag was given.
    pub fn given(&self) -> bool {
        self.none
            || self.internet
            || !(self.allow_domain.is_empty()
                && self.allow_cidr.is_empty()
                && self.allow_port.is_empty()
                && self.deny_domain.is_empty()
                && self.deny_cidr.is_empty()
                && self.deny_port.is_empty()
                && self.expose.is_empty())
    }

    /// The policy the flags say (no flags: deny everything, with an interface).
    pub fn policy(&self) -> anyhow::Result<NetworkPolicy> {
        if self.none {
            return Ok(NetworkPolicy::none());
        }
        let mut p = if self.internet {
            NetworkPolicy::internet()
        } else {
            NetworkPolicy::default()
        };
        p.allow
            .extend(self.allow_domain.iter().map(|d| NetRule::domain(d)));
        p.allow
            .extend(self.allow_cidr.iter().map(|c| NetRule::cidr(c)));
        for s in &self.allow_port {
            p.allow.push(port_rule(s).map_err(anyhow::Error::msg)?);
        }
        p.deny
            .extend(self.deny_domain.iter().map(|d| NetRule::domain(d)));
        p.deny
            .extend(self.deny_cidr.iter().map(|c| NetRule::cidr(c)));
        for s in &self.deny_port {
            p.deny.push(port_rule(s).map_err(anyhow::Error::msg)?);
        }
        p.expose = self.expose.clone();
        // Checked here too, so a typo is reported before anything is sent.
        p.parse().map_err(anyhow::Error::msg)?;
        Ok(p)
    }
}

/// `warren network` commands.
#[derive(Debug, Subcommand)]
pub enum NetworkCommand {
    /// Replace the network policy of a sandbox, or of every sandbox of a task.
    #[command(after_help = "Examples:\n  \
        warren network set $id --allow-domain pypi.org --allow-domain '*.pythonhosted.org'\n  \
        warren network set --task run-7 --none          # the agent phase: nothing reachable\n  \
        warren network set $id --allow-cidr 203.0.113.0/24 --allow-port 53/udp\n  \
        warren network set $id --internet --deny-cidr 203.0.113.0/24\n  \
        warren network set $id --expose 8000              # reachable from the node's host\n\n\
        The flags give the whole new policy (no flag: everything denied). New connections \
        follow it at once; an open connection that it no longer allows is reset at its next \
        packet.")]
    Set(SetArgs),
    /// Show a sandbox's network: mode, addresses, gateway and policy.
    #[command(after_help = "Examples:\n  warren network get $id\n  warren network get $id --json")]
    Get(GetArgs),
}

/// Options of `network set`.
#[derive(Debug, Args)]
pub struct SetArgs {
    /// The sandbox's id (or give --task).
    #[arg(required_unless_present = "task", conflicts_with = "task")]
    id: Option<String>,
    /// Every sandbox of this task, on every node.
    #[arg(long, value_name = "TASK")]
    task: Option<String>,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// Options of `network get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The sandbox's id.
    id: String,
}

fn rule_text(r: &NetRule) -> String {
    let what = r
        .cidr
        .clone()
        .or_else(|| r.domain.clone())
        .unwrap_or_else(|| "any address".into());
    let mut s = what;
    if let Some(p) = &r.ports {
        s.push_str(&format!(" port {p}"));
    }
    if let Some(p) = r.protocol {
        s.push_str(match p {
            Protocol::Tcp => " tcp",
            Protocol::Udp => " udp",
        });
    }
    s
}

/// Prints a sandbox's network for people.
pub fn print_status(st: &NetworkStatus) {
    match st.mode {
        NetworkMode::None => println!("mode      none (loopback only)"),
        NetworkMode::Filtered => println!("mode      filtered (outbound denied unless allowed)"),
    }
    if let Some(a) = &st.ipv4 {
        println!("ipv4      {a}");
    }
    if let Some(a) = &st.ipv6 {
        println!("ipv6      {a}");
    }
    if let Some(g) = &st.gateway {
        println!("gateway   {g} (also its DNS resolver)");
    }
    if st.allow.is_empty() {
        println!("allow     (nothing)");
    }
    for r in &st.allow {
        println!("allow     {}", rule_text(r));
    }
    for r in &st.deny {
        println!("deny      {}", rule_text(r));
    }
    for e in &st.exposed {
        println!("exposed   port {} at {} on the node's host", e.port, e.host);
    }
}

/// Runs a `warren network` command.
pub async fn run(client: &Client, json: bool, cmd: NetworkCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NetworkCommand::Get(a) => {
            let st = client.sandbox(&a.id)?.network().await?;
            if json {
                output::json(&st)?;
            } else {
                print_status(&st);
            }
            Ok(ExitCode::SUCCESS)
        }
        NetworkCommand::Set(a) => {
            let policy = a.policy.policy()?;
            if let Some(task) = a.task {
                let r = client.set_task_network(&task, &policy).await?;
                if json {
                    output::json(&r)?;
                } else {
                    println!(
                        "{}: new network policy on {} sandboxes",
                        r.task, r.succeeded
                    );
                    for f in &r.failed {
                        eprintln!("error: {}: {}", f.id, f.error.message);
                    }
                }
                output::warn_unreachable(&r.unreachable, "its sandboxes were not reached");
                return Ok(if r.failed.is_empty() && r.is_complete() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            let id = a.id.unwrap_or_default();
            let st = client.sandbox(&id)?.set_network(&policy).await?;
            if json {
                output::json(&st)?;
            } else {
                print_status(&st);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
