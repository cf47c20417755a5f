//! Function calls: `POST /v1/fncall/run`, `GET /v1/fncall/languages`, and SandboxFusion's
//! `POST /run_code` on top of them.
//!
//! A call is a program run once: the control plane turns the language into files and steps
//! (a compile and a run, or a run), picks a node by power-of-k like a create, and the node
//! runs it on a warm worker of the image (see the node's `fncall` module and the guest's
//! `call` module). Each call is untrusted code: it runs in a fresh view of the pristine image
//! with no network, under the sandbox policy and its own limits.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use warren_http::{Error, Json};
use warren_types::error::{ApiError, ErrorBody, ErrorCode};
use warren_types::fncall::{
    CaseResult, Checker, FnCallBatchRequest, FnCallBatchResult, FnCallRequest, FnCallResult,
    FnCallStatus, LanguageInfo, LanguageList, NodeCall, NodeCallResult, StepOutcome,
};
use warren_types::guest::{CallFile, CallSpec, CallStep, StepResult};

use super::S;
use crate::Control;
use crate::iam::{Perm, Principal};
use crate::node_api::CallError;
use crate::quota::CallSlots;
use crate::scheduler;

/// A language: its file, how it is compiled and run.
struct Lang {
    name: &'static str,
    aliases: &'static [&'static str],
    file: &'static str,
    compile: Option<&'static [&'static str]>,
    run: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    /// The program a missing toolchain is named by.
    needs: &'static str,
}

const LANGS: &[Lang] = &[
    Lang {
        name: "python",
        aliases: &["python3"],
        file: "main.py",
        compile: None,
        run: &["python3", "main.py"],
        env: &[("PYTHONDONTWRITEBYTECODE", "1"), ("PYTHONUNBUFFERED", "1")],
        needs: "python3",
    },
    Lang {
        name: "bash",
        aliases: &["sh", "shell"],
        file: "main.sh",
        compile: None,
        run: &["bash", "main.sh"],
        env: &[],
        needs: "bash",
    },
    Lang {
        name: "c",
        aliases: &[],
        file: "main.c",
        compile: Some(&["gcc", "-O2", "-std=gnu17", "-o", "main", "main.c", "-lm"]),
        run: &["./main"],
        env: &[],
        needs: "gcc",
    },
    Lang {
        name: "cpp",
        aliases: &["c++"],
        file: "main.cpp",
        compile: Some(&["g++", "-O2", "-std=c++17", "-o", "main", "main.cpp"]),
        run: &["./main"],
        env: &[],
        needs: "g++",
    },
    Lang {
        name: "java",
        aliases: &[],
        file: "Main.java",
        compile: Some(&["javac", "-encoding", "UTF-8", "Main.java"]),
        run: &["java", "-XX:+UseSerialGC", "-Xss64m", "-cp", ".", "Main"],
        env: &[],
        needs: "javac",
    },
    Lang {
        name: "javascript",
        aliases: &["nodejs", "node", "js"],
        file: "main.js",
        compile: None,
        run: &["node", "main.js"],
        env: &[],
        needs: "node",
    },
    Lang {
        name: "rust",
        aliases: &[],
        file: "main.rs",
        compile: Some(&["rustc", "-O", "--edition", "2021", "-o", "main", "main.rs"]),
        run: &["./main"],
        env: &[],
        needs: "rustc",
    },
    Lang {
        name: "go",
        aliases: &["golang"],
        file: "main.go",
        compile: Some(&["go", "build", "-o", "main", "main.go"]),
        run: &["./main"],
        env: &[
            ("GOCACHE", "/tmp/go-cache"),
            ("GOPATH", "/tmp/go"),
            ("GO111MODULE", "off"),
            ("CGO_ENABLED", "0"),
        ],
        needs: "go",
    },
];

fn lang(name: &str) -> Option<&'static Lang> {
    LANGS
        .iter()
        .find(|l| l.name == name || l.aliases.contains(&name))
}

/// Every language name and alias calls take.
pub fn language_names() -> Vec<&'static str> {
    LANGS
        .iter()
        .flat_map(|l| std::iter::once(l.name).chain(l.aliases.iter().copied()))
        .collect()
}

fn known() -> String {
    LANGS.iter().map(|l| l.name).collect::<Vec<_>>().join(", ")
}

/// Most bytes of a program's source.
const MAX_CODE: usize = 4 << 20;
/// Most bytes of all files of a call together (decoded).
const MAX_FILES_BYTES: usize = 16 << 20;
/// Most files beside the program.
const MAX_FILES: usize = 256;
/// Longest timeout of a step, seconds.
const MAX_TIMEOUT: f64 = 300.0;
/// Memory bounds of a call.
const MIN_MEMORY: u64 = 16 << 20;
const MAX_MEMORY: u64 = 16 << 30;
/// Processes and threads a call may run at once (the worker's pids limit adds the guest's).
const PIDS: u32 = 256;
/// Most bytes of fetched files together.
const MAX_FETCH: u64 = 16 << 20;
/// The longest a call may wait for a worker (`queue_timeout`).
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(600);

fn invalid(m: impl Into<String>) -> Error {
    Error(ApiError::invalid(m))
}

fn seconds(v: Option<f64>, default: f64, what: &str) -> Result<Duration, Error> {
    seconds_within(v.unwrap_or(default), what, MAX_TIMEOUT)
}

/// `s` seconds, above 0 and at most `most`.
fn seconds_within(s: f64, what: &str, most: f64) -> Result<Duration, Error> {
    if !(s.is_finite() && s > 0.0 && s <= most) {
        return Err(invalid(format!(
            "{what} {s} is not a number of seconds above 0 and at most {most}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A call that waited past its deadline (for a worker, or for room under its project's
/// quota), as Warren's own API answers it: 429 with Retry-After (`/run_code` answers 504,
/// which SandboxFusion's clients retry).
fn waited_too_long(e: Error) -> Error {
    if e.0.code == ErrorCode::Timeout {
        Error(ApiError::capacity(e.0.message, 1))
    } else {
        e
    }
}

/// A call, checked: what goes to the node, and how to read what comes back.
struct Planned {
    lang: &'static Lang,
    call: NodeCall,
}

fn plan(c: &Control, req: &FnCallRequest) -> Result<Planned, Error> {
    let Some(lang) = lang(&req.language) else {
        return Err(invalid(format!(
            "unknown language {:?}; known: {} (GET /v1/fncall/languages)",
            req.language,
            known()
        )));
    };
    if req.code.len() > MAX_CODE {
        return Err(Error(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the code is {} bytes; at most {MAX_CODE}", req.code.len()),
        )));
    }
    let run_timeout = seconds(req.timeout, 10.0, "timeout")?;
    let compile_timeout = seconds(req.compile_timeout, 30.0, "compile_timeout")?;
    let wait = req
        .queue_timeout
        .map(|s| seconds_within(s, "queue_timeout", MAX_QUEUE_WAIT.as_secs_f64()))
        .transpose()?;
    let memory = req.memory.map_or(512 << 20, |m| m.bytes());
    if !(MIN_MEMORY..=MAX_MEMORY).contains(&memory) {
        return Err(invalid(format!(
            "memory {} is outside 16Mi to 16Gi",
            warren_types::ByteSize(memory)
        )));
    }
    // Workers are pooled by memory: sizes are rounded up to a power of two, so there are a
    // handful of pools, not one per byte count asked for.
    let memory = memory.next_power_of_two();
    let max_output = req.max_output.map_or(8 << 20, |m| m.bytes());
    if max_output == 0 || max_output > 64 << 20 {
        return Err(invalid("max_output is 1 byte to 64Mi"));
    }
    if req.files.len() > MAX_FILES {
        return Err(invalid(format!(
            "{} files; at most {MAX_FILES}",
            req.files.len()
        )));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut files = vec![CallFile {
        path: lang.file.into(),
        data: b64.encode(&req.code),
        executable: false,
    }];
    let mut total = req.code.len();
    for (path, data) in &req.files {
        check_path(path)?;
        if path == lang.file {
            return Err(invalid(format!(
                "file {path} is where the program goes; name it otherwise"
            )));
        }
        let bytes = b64
            .decode(data)
            .map_err(|e| invalid(format!("file {path} is not base64: {e}")))?;
        total += bytes.len();
        if total > MAX_FILES_BYTES {
            return Err(Error(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the files are more than {MAX_FILES_BYTES} bytes together"),
            )));
        }
        files.push(CallFile {
            path: path.clone(),
            data: data.clone(),
            executable: false,
        });
    }
    for p in &req.fetch_files {
        check_path(p)?;
    }
    if req.fetch_files.len() > MAX_FILES {
        return Err(invalid(format!("at most {MAX_FILES} fetch_files")));
    }
    let mut steps = Vec::new();
    if let Some(compile) = lang.compile {
        steps.push(CallStep {
            argv: compile.iter().map(|s| s.to_string()).collect(),
            stdin: String::new(),
            timeout_ms: compile_timeout.as_millis() as u64,
            max_output,
            required: true,
        });
    }
    steps.push(CallStep {
        argv: lang.run.iter().map(|s| s.to_string()).collect(),
        stdin: b64.encode(req.stdin.as_deref().unwrap_or_default()),
        timeout_ms: run_timeout.as_millis() as u64,
        max_output,
        required: false,
    });
    let image = req.image.clone().unwrap_or_else(|| "host".into());
    let _ = c;
    Ok(Planned {
        lang,
        call: NodeCall {
            image,
            resolved: None,
            memory: warren_types::ByteSize(memory),
            spec: CallSpec {
                files,
                steps,
                env: lang
                    .env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                fetch: req.fetch_files.clone(),
                max_fetch: MAX_FETCH,
                pids: PIDS,
                file_size: memory,
                tmp_size: memory,
            },
            project: None,
            wait_ms: wait.map(|d| d.as_millis() as u64),
        },
    })
}

fn check_path(p: &str) -> Result<(), Error> {
    let ok = !p.is_empty()
        && p.len() <= 255
        && !p.starts_with('/')
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "file path {p:?} must be relative, without `.` or `..` parts, at most 255 bytes"
        )))
    }
}

/// (image, memory) → nodes that ran such a call, and when.
type SeenMap = std::collections::HashMap<(String, u64), Vec<(String, std::time::Instant)>>;

/// Nodes that ran function calls of each (image, memory) lately, so likely to hold warm
/// workers for them: this replica's memory only (another replica learns its own).
#[derive(Debug, Default)]
pub struct WarmCalls {
    seen: std::sync::Mutex<SeenMap>,
}

/// How long a node that ran a call of a kind is taken to hold a warm worker for it (the
/// node's idle workers live 10 minutes).
const WARM_FOR: Duration = Duration::from_secs(540);

impl WarmCalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, SeenMap> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn warm(&self, key: &(String, u64), node: &str) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|v| v.iter().any(|(n, at)| n == node && at.elapsed() < WARM_FOR))
    }

    fn ran(&self, key: (String, u64), node: &str) {
        let mut m = self.lock();
        if m.len() > 4096 {
            m.retain(|_, v| v.iter().any(|(_, at)| at.elapsed() < WARM_FOR));
        }
        let v = m.entry(key).or_default();
        v.retain(|(n, at)| n != node && at.elapsed() < WARM_FOR);
        v.push((node.to_string(), std::time::Instant::now()));
    }
}

/// Runs a planned call on a node: power-of-k over the nodes that take containers — of the
/// first k candidates (the best of k sampled, then others at random), one that ran a call of
/// this image and memory lately goes first (it likely holds a warm worker) — and the next
/// candidate when one is full.
async fn dispatch(c: &Control, call: &NodeCall) -> Result<(NodeCallResult, String), Error> {
    let nodes = c.nodes.snapshot();
    if nodes.is_empty() {
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            "no nodes are registered: start a node daemon (warren node --join URL)",
        )));
    }
    let selector = BTreeMap::new();
    let ask = scheduler::Ask {
        memory: call.memory.bytes(),
        cpu: 1000,
        backend: warren_types::api::BackendKind::Container,
        selector: &selector,
        burst_above: None,
    };
    let mut order = scheduler::candidates(
        &nodes,
        c.cfg.schedule_k,
        c.cfg.schedule_attempts,
        &ask,
        None,
        &mut rand::rng(),
    );
    let key = (call.image.clone(), call.memory.bytes());
    let sampled = c.cfg.schedule_k.max(1).min(order.len());
    if let Some(i) = (0..sampled).find(|&i| c.warm_calls.warm(&key, &order[i].id.to_string())) {
        let warm = order.remove(i);
        order.insert(0, warm);
    }
    let budget: Duration = call
        .spec
        .steps
        .iter()
        .map(|s| Duration::from_millis(s.timeout_ms))
        .sum::<Duration>()
        + call.wait()
        + Duration::from_secs(90);
    let mut last = None;
    for node in &order {
        match node.api().fncall(call, budget).await {
            Ok(r) => {
                c.warm_calls.ran(key, &node.id.to_string());
                return Ok((r, node.id.to_string()));
            }
            // Full: the next candidate may have room. (Not a call whose worker stopped under
            // it: that one may have stopped it, and is not sent on to stop another; its 503
            // says to send it again.)
            Err(CallError::Refused(e)) if e.code == ErrorCode::Capacity => {
                last = Some(Error(e));
            }
            Err(CallError::Refused(e)) => return Err(Error(e)),
            Err(CallError::Unreachable(why)) => {
                tracing::warn!(node_id = %node.id, "function call: {why}");
                last = Some(super::forward::unavailable(node, &why));
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        Error(ApiError::capacity(
            "no node can run function calls now; retry after Retry-After seconds",
            2,
        ))
    }))
}

fn outcome(s: &StepResult) -> StepOutcome {
    let b64 = base64::engine::general_purpose::STANDARD;
    let text = |d: &str| String::from_utf8_lossy(&b64.decode(d).unwrap_or_default()).into_owned();
    StepOutcome {
        stdout: text(&s.stdout),
        stderr: text(&s.stderr),
        exit_code: s.exit_code,
        signal: s.signal,
        timed_out: s.timed_out,
        output_limited: s.output_limit,
        wall_time: s.wall_us as f64 / 1e6,
        cpu_time: s.cpu_us as f64 / 1e6,
        peak_memory: s.max_rss,
    }
}

/// A toolchain the image lacks: the request's problem (this image cannot run this language),
/// not the program's.
fn missing_toolchain(lang: &Lang, image: &str, why: &str) -> Error {
    invalid(format!(
        "language {} needs `{}`, which image {image} cannot run ({why}); use an image that has \
         it (`image`), or another language",
        lang.name, lang.needs
    ))
}

/// What a node's answer means.
fn judge(p: &Planned, answer: NodeCallResult, node: String) -> Result<FnCallResult, Error> {
    let steps = &answer.result.steps;
    // A toolchain the image lacks is the request's problem (this image cannot run this
    // language), not the program's.
    if let Some(why) = steps.iter().find_map(|s| s.not_started.as_deref()) {
        return Err(missing_toolchain(p.lang, &p.call.image, why));
    }
    let (compile, run) = match (p.lang.compile.is_some(), steps.as_slice()) {
        (true, [c, r]) => (Some(c), Some(r).filter(|r| r.ran)),
        (false, [r]) => (None, Some(r)),
        _ => {
            return Err(Error(ApiError::internal(format!(
                "the node answered {} steps for {} asked",
                steps.len(),
                p.call.spec.steps.len()
            ))));
        }
    };
    let status = match (compile, run) {
        (Some(c), _) if c.exit_code != Some(0) => FnCallStatus::CompileError,
        (_, None) => FnCallStatus::CompileError,
        // The worker's OOM count rose during the call and the run did not succeed: it ran out
        // of memory (the kernel killed it, or an allocation failed on the way there).
        (_, Some(r)) => run_status(r, answer.memory_limit),
    };
    let mut files = BTreeMap::new();
    let mut missing = BTreeMap::new();
    for f in &answer.result.files {
        match (&f.data, &f.error) {
            (Some(d), _) => {
                files.insert(f.path.clone(), d.clone());
            }
            (None, e) => {
                missing.insert(f.path.clone(), e.clone().unwrap_or_default());
            }
        }
    }
    Ok(FnCallResult {
        status,
        compile: compile.map(outcome),
        run: run.map(outcome),
        files,
        missing_files: missing,
        node,
    })
}

/// Checks `fncall.run` on the call's project and that its image may be used there; fills in
/// the image's layers. Counts up to `want` calls in flight in the project (as many as its
/// `max_fncalls` and its ancestors' leave room for, at least one: none is a 429).
async fn authorize(
    c: &Control,
    who: &Principal,
    project: Option<&str>,
    call: &mut NodeCall,
    want: u64,
) -> Result<CallSlots, Error> {
    let project = project.unwrap_or(&who.project).to_string();
    warren_types::project::check_path(&project).map_err(|e| Error(ApiError::invalid(e)))?;
    if !who.allows(Perm::FnCallRun, &project) {
        return Err(Error(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "identity {} (key {}) does not hold fncall.run on {project}",
                who.identity, who.key_id
            ),
        )));
    }
    super::project_must_exist(c, &project).await?;
    if call.image.trim() != "host" {
        call.resolved = Some(
            c.catalog
                .resolve_for(&call.image, &project)
                .await
                .map_err(super::images::image_error)?,
        );
    }
    call.project = Some(project.clone());
    let quotas = c.iam.quotas().await.map_err(|e| Error(e.into()))?;
    c.usage.refresh(&c.nodes);
    // Under a quota with no room now, the call waits for calls to end, as long as it would
    // wait for a worker; past that, a 504 (the answer for a deadline; `run` and `batch` say
    // 429).
    let wait = call.wait();
    let deadline = tokio::time::Instant::now() + wait;
    let slots = c
        .usage
        .wait_calls(&quotas, &project, want, call.memory.bytes(), deadline)
        .await
        .map_err(Error)?;
    // What is left of the wait, for the node.
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    call.wait_ms = Some((left.as_millis() as u64).max(1));
    Ok(slots)
}

/// Run a program once on a warm worker: its source (and more files) in a fresh working
/// directory, compiled when the language is, then run with `stdin`, under its own limits (wall
/// clock, memory, output) with no network. Nothing of one call is left for the next. The
/// status says how it ended; a language whose toolchain the image lacks is a 400.
#[utoipa::path(post, path = "/v1/fncall/run", tag = "fncall",
    request_body = FnCallRequest,
    responses((status = 200, body = FnCallResult),
        (status = 400, description = "Bad request, unknown language, or a toolchain the image lacks.", body = ErrorBody),
        (status = 404, description = "Unknown image.", body = ErrorBody),
        (status = 413, description = "Code or files too large.", body = ErrorBody),
        (status = 429, description = "No worker became free (or the project's max_fncalls or max_memory left no room) before the call's deadline (`queue_timeout`, default its own timeouts together): retry after Retry-After seconds.", body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn run(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<Principal>>,
    Json(req): Json<FnCallRequest>,
) -> Result<Json<FnCallResult>, Error> {
    let mut p = plan(&c, &req)?;
    let _slot = authorize(&c, &who, req.project.as_deref(), &mut p.call, 1)
        .await
        .map_err(waited_too_long)?;
    let (answer, node) = dispatch(&c, &p.call).await.map_err(waited_too_long)?;
    Ok(Json(judge(&p, answer, node)?))
}

/// The languages function calls know, with their commands. Which of them run depends on the
/// image's toolchains (the default `host` image: the machine's own).
#[utoipa::path(get, path = "/v1/fncall/languages", tag = "fncall",
    responses((status = 200, body = LanguageList)), security(("api_key" = [])))]
pub async fn languages() -> Json<LanguageList> {
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    Json(LanguageList {
        languages: LANGS
            .iter()
            .map(|l| LanguageInfo {
                name: l.name.into(),
                aliases: strs(l.aliases),
                file: l.file.into(),
                compile: l.compile.map(strs),
                run: strs(l.run),
            })
            .collect(),
    })
}

/// SandboxFusion's `RunCodeRequest` (`POST /run_code`). Unknown fields are ignored, as
/// SandboxFusion's server ignores them.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
pub struct RunCodeRequest {
    /// The program.
    pub code: String,
    /// SandboxFusion's language names (`python`, `cpp`, `nodejs`, `go`, `java`, `bash`,
    /// `rust`) and Warren's (`c`, `javascript`).
    pub language: String,
    /// Seconds the compile may take (default 10).
    #[serde(default)]
    pub compile_timeout: Option<f64>,
    /// Seconds the run may take (default 10).
    #[serde(default)]
    pub run_timeout: Option<f64>,
    /// Memory in MiB (-1, 0 or absent: 1024; less than 16: 16).
    #[serde(default, rename = "memory_limit_MB")]
    #[schema(maximum = 16384)]
    pub memory_limit_mb: Option<i64>,
    /// Standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// More files: path → base64 content (null entries are skipped).
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    /// Files to return.
    #[serde(default)]
    pub fetch_files: Vec<String>,
}

/// SandboxFusion's `CommandRunResult`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct CommandRunResult {
    /// `Finished`, `TimeLimitExceeded` or `Error`.
    pub status: &'static str,
    /// Wall-clock seconds.
    pub execution_time: Option<f64>,
    /// Exit code; a signal's death is minus the signal; none at a time limit.
    pub return_code: Option<i32>,
    /// Standard output (always a string).
    pub stdout: String,
    /// Standard error (always a string).
    pub stderr: String,
    /// CPU seconds (a field the `sandbox-fusion` client knows).
    pub cpu_time: Option<f64>,
}

/// SandboxFusion's `RunCodeResponse`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RunCodeResponse {
    /// `Success`, `Failed` or `SandboxError`.
    pub status: &'static str,
    /// Why, for `SandboxError`; empty otherwise.
    pub message: String,
    /// The compile, for compiled languages.
    pub compile_result: Option<CommandRunResult>,
    /// The run (none when the compile failed).
    pub run_result: Option<CommandRunResult>,
    /// The node that ran it.
    pub executor_pod_name: Option<String>,
    /// Fetched files: path → base64.
    pub files: BTreeMap<String, String>,
}

fn command_result(o: &StepOutcome) -> CommandRunResult {
    let (status, return_code) = if o.timed_out {
        ("TimeLimitExceeded", None)
    } else {
        ("Finished", o.exit_code.or(o.signal.map(|s| -s)))
    };
    CommandRunResult {
        status,
        execution_time: Some(o.wall_time),
        return_code,
        stdout: o.stdout.clone(),
        stderr: o.stderr.clone(),
        cpu_time: Some(o.cpu_time),
    }
}

/// SandboxFusion's `/run_code`, for the frameworks that call it (verl's reward path, the
/// `sandbox-fusion` client): the same request and answer, its status strings, its language
/// names. A call that ran is a 200 whatever the program did (`Success` or `Failed`, as
/// SandboxFusion answers); what Warren refuses (an unknown language, a toolchain the image
/// lacks, bad input) is a 4xx with Warren's error, which the client reports. A call waits for a
/// worker (and for room under its project's quota) up to its compile and run timeouts
/// together; past that it is answered 504, the status SandboxFusion's clients retry (verl's
/// among them), never a 429 they would score as a wrong answer. The key comes as
/// `Authorization: Bearer`, `X-API-Key`, or HTTP Basic credentials in the URL
/// (`http://fncall:KEY@host:port`, the only way the `sandbox-fusion` client can send one).
#[utoipa::path(post, path = "/run_code", tag = "fncall",
    request_body = RunCodeRequest,
    responses((status = 200, body = RunCodeResponse),
        (status = 400, description = "Bad request, unknown language, or a toolchain the image lacks.", body = ErrorBody),
        (status = 413, description = "Code or files too large.", body = ErrorBody),
        (status = 429, description = "More function calls already wait on the node than it queues, or the project's quota can never admit the call (max_fncalls 0, max_memory below its memory).", body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody),
        (status = 504, description = "No worker became free (or the project's quota left no room) before the call's deadline, its compile and run timeouts together: SandboxFusion's clients retry it.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn run_code(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<Principal>>,
    Json(req): Json<RunCodeRequest>,
) -> Result<Json<RunCodeResponse>, Error> {
    // SandboxFusion's -1 is "no limit": Warren's calls always have one, 1024 MiB (verl's
    // default) then.
    let memory = match req.memory_limit_mb {
        None => 1024 << 20,
        Some(m) if m <= 0 => 1024 << 20,
        Some(m) if m <= 16384 => (m.max(16) as u64) << 20,
        Some(m) => {
            return Err(invalid(format!(
                "memory_limit_MB {m} is more than 16384 (-1 or 0 for the default, 1024)"
            )));
        }
    };
    let ours = FnCallRequest {
        language: req.language.clone(),
        code: req.code,
        image: None,
        stdin: req.stdin,
        files: req
            .files
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect(),
        timeout: Some(req.run_timeout.unwrap_or(10.0)),
        compile_timeout: Some(req.compile_timeout.unwrap_or(10.0)),
        memory: Some(warren_types::ByteSize(memory)),
        max_output: None,
        fetch_files: req.fetch_files,
        project: None,
        queue_timeout: None,
    };
    let mut p = plan(&c, &ours)?;
    let _slot = authorize(&c, &who, None, &mut p.call, 1).await?;
    let (answer, node) = dispatch(&c, &p.call).await?;
    let r = judge(&p, answer, node)?;
    Ok(Json(RunCodeResponse {
        status: if r.status == FnCallStatus::Ok {
            "Success"
        } else {
            "Failed"
        },
        message: String::new(),
        compile_result: r.compile.as_ref().map(command_result),
        run_result: r.run.as_ref().map(command_result),
        executor_pod_name: Some(r.node),
        files: r.files,
    }))
}

/// Most cases in one batch.
const MAX_CASES: usize = 1000;
/// Most cases one worker runs of a batch (more are spread over more workers).
const CHUNK: usize = 16;
/// Most output one chunk may bring back (its answer is one guest message, held by the
/// worker's call server within the worker's memory beyond the call's).
const CHUNK_OUTPUT: u64 = 16 << 20;
/// Most output of one case (each of stdout and stderr).
const MAX_CASE_OUTPUT: u64 = 2 << 20;
/// Most output of all cases together.
const BATCH_OUTPUT: u64 = 64 << 20;

/// Languages whose compile makes one binary, `main`, that can be carried to other workers.
fn one_binary(lang: &Lang) -> bool {
    lang.compile.is_some() && lang.run == ["./main"]
}

fn run_step(
    lang: &Lang,
    stdin: &str,
    timeout: Duration,
    max_output: u64,
    extra: &[String],
) -> CallStep {
    let b64 = base64::engine::general_purpose::STANDARD;
    CallStep {
        argv: lang
            .run
            .iter()
            .map(|s| s.to_string())
            .chain(extra.iter().cloned())
            .collect(),
        stdin: b64.encode(stdin),
        timeout_ms: timeout.as_millis() as u64,
        max_output,
        required: false,
    }
}

fn compile_step(lang: &Lang, timeout: Duration, max_output: u64) -> Option<CallStep> {
    lang.compile.map(|c| CallStep {
        argv: c.iter().map(|s| s.to_string()).collect(),
        stdin: String::new(),
        timeout_ms: timeout.as_millis() as u64,
        max_output,
        required: true,
    })
}

fn spec_with(lang: &Lang, files: Vec<CallFile>, steps: Vec<CallStep>, memory: u64) -> CallSpec {
    CallSpec {
        files,
        steps,
        env: lang
            .env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        fetch: Vec::new(),
        max_fetch: MAX_FETCH,
        pids: PIDS,
        file_size: memory,
        tmp_size: memory,
    }
}

/// The status of a run step of a call whose worker's OOM count did (`oom`) or did not rise.
fn run_status(r: &StepResult, oom: bool) -> FnCallStatus {
    let failed = r.exit_code != Some(0);
    if r.timed_out {
        FnCallStatus::Timeout
    } else if r.output_limit {
        FnCallStatus::OutputLimit
    } else if failed && oom {
        FnCallStatus::MemoryLimit
    } else if failed {
        FnCallStatus::RuntimeError
    } else {
        FnCallStatus::Ok
    }
}

/// Whether `out` matches `expected` under a built-in checker.
fn matches(checker: &Checker, out: &str, expected: &str) -> bool {
    match checker {
        Checker::Exact => out == expected,
        Checker::Whitespace => out.split_whitespace().eq(expected.split_whitespace()),
        Checker::Float { tolerance } => {
            let tol = tolerance.unwrap_or(1e-6);
            let (a, b): (Vec<&str>, Vec<&str>) = (
                out.split_whitespace().collect(),
                expected.split_whitespace().collect(),
            );
            a.len() == b.len()
                && a.iter().zip(&b).all(|(x, y)| {
                    x == y
                        || match (x.parse::<f64>(), y.parse::<f64>()) {
                            (Ok(x), Ok(y)) if x.is_finite() && y.is_finite() => {
                                (x - y).abs() <= tol * y.abs().max(1.0)
                            }
                            _ => false,
                        }
                })
        }
        Checker::Custom { .. } => false,
    }
}

/// Run one program over many test cases: compiled once (for compiled languages whose compile
/// makes one binary, that binary is carried to every worker; Java compiles on each), the cases
/// spread over workers 16 at a time, each run with its own stdin in its own PID namespace, and
/// judged by the checker (`exact` by default; `whitespace`, `float` with a tolerance, or a
/// program of your own). Cases on one worker share its working directory, as an online
/// judge's runs of one submission do.
#[utoipa::path(post, path = "/v1/fncall/batch", tag = "fncall",
    request_body = FnCallBatchRequest,
    responses((status = 200, body = FnCallBatchResult),
        (status = 400, description = "Bad request, unknown language, or a toolchain the image lacks.", body = ErrorBody),
        (status = 404, description = "Unknown image.", body = ErrorBody),
        (status = 413, description = "Code, files or expected output too large.", body = ErrorBody),
        (status = 429, description = "No worker became free (or the project's max_fncalls or max_memory left no room) before the call's deadline (`queue_timeout`, default its own timeouts together): retry after Retry-After seconds.", body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn batch(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<Principal>>,
    Json(req): Json<FnCallBatchRequest>,
) -> Result<Json<FnCallBatchResult>, Error> {
    run_batch(c, who, req).await.map_err(waited_too_long)
}

async fn run_batch(
    c: std::sync::Arc<Control>,
    who: std::sync::Arc<Principal>,
    req: FnCallBatchRequest,
) -> Result<Json<FnCallBatchResult>, Error> {
    if req.cases.is_empty() || req.cases.len() > MAX_CASES {
        return Err(invalid(format!(
            "{} cases; a batch has 1 to {MAX_CASES}",
            req.cases.len()
        )));
    }
    let max_output = req.max_output.map_or(1 << 20, |m| m.bytes());
    if max_output == 0 || max_output > MAX_CASE_OUTPUT {
        return Err(invalid(format!(
            "max_output is 1 byte to {} in a batch",
            warren_types::ByteSize(MAX_CASE_OUTPUT)
        )));
    }
    if max_output.saturating_mul(req.cases.len() as u64) > BATCH_OUTPUT {
        return Err(invalid(format!(
            "{} cases of {} output each is more than {} together: lower max_output or split \
             the batch",
            req.cases.len(),
            warren_types::ByteSize(max_output),
            warren_types::ByteSize(BATCH_OUTPUT)
        )));
    }
    let input_bytes: usize = req
        .cases
        .iter()
        .map(|t| t.stdin.len() + t.expected.as_ref().map_or(0, String::len))
        .sum();
    if input_bytes > MAX_FILES_BYTES {
        return Err(Error(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the cases' inputs and expected outputs are more than {MAX_FILES_BYTES} bytes together"
            ),
        )));
    }
    let checker = req.checker.clone().unwrap_or(Checker::Exact);
    let custom = match &checker {
        Checker::Custom { language, code } => {
            let l = lang(language).ok_or_else(|| {
                invalid(format!(
                    "unknown checker language {language:?}; known: {}",
                    known()
                ))
            })?;
            Some((l, code.clone()))
        }
        Checker::Float { tolerance: Some(t) } if !(t.is_finite() && *t >= 0.0) => {
            return Err(invalid(
                "the float checker's tolerance is a number 0 or more",
            ));
        }
        _ => None,
    };
    // The program and its files, checked as a single call's.
    let single = FnCallRequest {
        language: req.language.clone(),
        code: req.code.clone(),
        image: req.image.clone(),
        stdin: None,
        files: req.files.clone(),
        timeout: req.timeout,
        compile_timeout: req.compile_timeout,
        memory: req.memory,
        max_output: Some(warren_types::ByteSize(max_output)),
        fetch_files: Vec::new(),
        project: req.project.clone(),
        queue_timeout: req.queue_timeout,
    };
    let mut p = plan(&c, &single)?;
    // One call in flight for each worker the cases are spread over at once: as many chunks
    // as the project's quota leaves room for (the compile and the custom checker run on one).
    let per_chunk = CHUNK.min((CHUNK_OUTPUT / (2 * max_output)).max(1) as usize);
    let want = req.cases.len().div_ceil(per_chunk) as u64;
    let slots = authorize(&c, &who, req.project.as_deref(), &mut p.call, want).await?;
    let lang = p.lang;
    let run_timeout = seconds(req.timeout, 10.0, "timeout")?;
    let compile_timeout = seconds(req.compile_timeout, 30.0, "compile_timeout")?;
    let memory = p.call.memory.bytes();
    let mut files = p.call.spec.files.clone();
    let mut nodes = Vec::new();

    // Compile once; carry the binary where there is one.
    let mut compile = None;
    let mut compile_in_chunks = false;
    if let Some(step) = compile_step(lang, compile_timeout, max_output) {
        if one_binary(lang) {
            let mut call = p.call.clone();
            call.spec = spec_with(lang, files.clone(), vec![step], memory);
            call.spec.fetch = vec!["main".into()];
            let (answer, node) = dispatch(&c, &call).await?;
            nodes.push(node);
            let r = answer.result.steps.first().cloned().unwrap_or_default();
            if let Some(why) = &r.not_started {
                return Err(missing_toolchain(lang, &p.call.image, why));
            }
            let out = outcome(&r);
            if r.exit_code != Some(0) {
                return Ok(Json(FnCallBatchResult {
                    status: FnCallStatus::CompileError,
                    compile: Some(out),
                    cases: Vec::new(),
                    passed: 0,
                    nodes,
                }));
            }
            let Some(binary) = answer.result.files.first().and_then(|f| f.data.clone()) else {
                return Err(Error(ApiError::internal(
                    "the compile succeeded but its binary could not be read back",
                )));
            };
            files.push(CallFile {
                path: "main".into(),
                data: binary,
                executable: true,
            });
            compile = Some(out);
        } else {
            compile_in_chunks = true;
        }
    }

    // The cases, spread over workers.
    let chunks: Vec<&[warren_types::fncall::TestCase]> = req.cases.chunks(per_chunk).collect();
    // Each chunk's call is made when it is sent (at most as many held at once as run: each
    // carries the program's files, a compiled binary among them).
    let build = |cases: &[warren_types::fncall::TestCase]| {
        let mut steps = Vec::new();
        if compile_in_chunks && let Some(s) = compile_step(lang, compile_timeout, max_output) {
            steps.push(s);
        }
        steps.extend(
            cases
                .iter()
                .map(|t| run_step(lang, &t.stdin, run_timeout, max_output, &[])),
        );
        let mut call = p.call.clone();
        call.spec = spec_with(lang, files.clone(), steps, memory);
        call
    };
    use futures_util::{StreamExt, TryStreamExt};
    let c = &c;
    // The first chunk that fails fails the batch: the rest are not sent (or are dropped).
    let answers: Vec<_> = futures_util::stream::iter(0..chunks.len())
        .map(|k| {
            let call = build(chunks[k]);
            async move { dispatch(c, &call).await }
        })
        .buffered(slots.n as usize)
        .try_collect()
        .await?;
    let mut cases = Vec::with_capacity(req.cases.len());
    let mut outputs = Vec::with_capacity(req.cases.len());
    for ((answer, node), chunk) in answers.into_iter().zip(&chunks) {
        if !nodes.contains(&node) {
            nodes.push(node);
        }
        let mut steps = answer.result.steps.iter();
        if compile_in_chunks {
            let r = steps.next().cloned().unwrap_or_default();
            if let Some(why) = &r.not_started {
                return Err(missing_toolchain(lang, &p.call.image, why));
            }
            if r.exit_code != Some(0) {
                return Ok(Json(FnCallBatchResult {
                    status: FnCallStatus::CompileError,
                    compile: Some(outcome(&r)),
                    cases: Vec::new(),
                    passed: 0,
                    nodes,
                }));
            }
            compile.get_or_insert_with(|| outcome(&r));
        }
        for (t, r) in chunk.iter().zip(steps) {
            if let Some(why) = &r.not_started {
                return Err(missing_toolchain(lang, &p.call.image, why));
            }
            let status = run_status(r, answer.memory_limit);
            let run = outcome(r);
            let passed = match (&t.expected, status, &custom) {
                (Some(e), FnCallStatus::Ok, None) => Some(matches(&checker, &run.stdout, e)),
                (Some(_), FnCallStatus::Ok, Some(_)) => None, // judged below
                (Some(_), _, _) => Some(false),
                (None, _, _) => None,
            };
            outputs.push(run.stdout.clone());
            cases.push(CaseResult {
                status,
                run,
                passed,
                checker_message: None,
            });
        }
    }
    if cases.len() != req.cases.len() {
        return Err(Error(ApiError::internal(format!(
            "the nodes answered {} cases of {}",
            cases.len(),
            req.cases.len()
        ))));
    }
    if let Some((checker_lang, code)) = custom {
        judge_custom(
            c,
            &p.call,
            checker_lang,
            &code,
            &req.cases,
            &outputs,
            &mut cases,
            slots.n as usize,
        )
        .await?;
    }
    let passed = cases.iter().filter(|c| c.passed == Some(true)).count();
    Ok(Json(FnCallBatchResult {
        status: FnCallStatus::Ok,
        compile,
        cases,
        passed,
        nodes,
    }))
}

/// Runs a custom checker over the cases that ran to completion and have an expected output:
/// in chunks, `parallel` at a time, each case's input, output and expected output as files
/// `N/input.txt`, `N/output.txt`, `N/expected.txt` and as the checker's three arguments.
#[allow(clippy::too_many_arguments)]
async fn judge_custom(
    c: &Control,
    base: &NodeCall,
    lang: &'static Lang,
    code: &str,
    tests: &[warren_types::fncall::TestCase],
    outputs: &[String],
    cases: &mut [CaseResult],
    parallel: usize,
) -> Result<(), Error> {
    use futures_util::{StreamExt, TryStreamExt};
    let b64 = base64::engine::general_purpose::STANDARD;
    let todo: Vec<usize> = (0..cases.len())
        .filter(|&i| tests[i].expected.is_some() && cases[i].status == FnCallStatus::Ok)
        .collect();
    let timeout = Duration::from_secs(10);
    let max_output = 64 << 10;
    let chunks: Vec<&[usize]> = todo.chunks(CHUNK).collect();
    // Each chunk's call is made when it is sent (at most `parallel` held at once: their
    // files copy the cases' outputs).
    let build = |chunk: &[usize]| {
        let mut files = vec![CallFile {
            path: lang.file.into(),
            data: b64.encode(code),
            executable: false,
        }];
        let mut steps: Vec<CallStep> = compile_step(lang, Duration::from_secs(60), max_output)
            .into_iter()
            .collect();
        for &i in chunk {
            for (name, text) in [
                ("input.txt", tests[i].stdin.as_str()),
                ("output.txt", outputs[i].as_str()),
                (
                    "expected.txt",
                    tests[i].expected.as_deref().unwrap_or_default(),
                ),
            ] {
                files.push(CallFile {
                    path: format!("{i}/{name}"),
                    data: b64.encode(text),
                    executable: false,
                });
            }
            let args = ["input.txt", "output.txt", "expected.txt"].map(|n| format!("{i}/{n}"));
            steps.push(run_step(lang, "", timeout, max_output, &args));
        }
        let mut call = base.clone();
        call.spec = spec_with(lang, files, steps, 256 << 20);
        call
    };
    let answers: Vec<_> = futures_util::stream::iter(0..chunks.len())
        .map(|k| {
            let call = build(chunks[k]);
            async move { dispatch(c, &call).await }
        })
        .buffered(parallel.max(1))
        .try_collect()
        .await?;
    for ((answer, _), chunk) in answers.into_iter().zip(chunks) {
        let mut results = answer.result.steps.iter();
        if lang.compile.is_some() {
            let r = results.next().cloned().unwrap_or_default();
            if r.not_started.is_some() || r.exit_code != Some(0) {
                return Err(invalid(format!(
                    "the checker did not compile: {}",
                    outcome(&r).stderr.chars().take(2000).collect::<String>()
                )));
            }
        }
        for (&i, r) in chunk.iter().zip(results) {
            if let Some(why) = &r.not_started {
                return Err(invalid(format!(
                    "the checker's language {} needs `{}` ({why})",
                    lang.name, lang.needs
                )));
            }
            let o = outcome(r);
            cases[i].passed = Some(r.exit_code == Some(0) && !r.timed_out);
            let msg = format!("{}{}", o.stdout, o.stderr);
            cases[i].checker_message = (!msg.is_empty()).then_some(msg);
        }
    }
    Ok(())
}

/// A listener's router for SandboxFusion clients that cannot send a key at all: only
/// `POST /run_code` (and SandboxFusion's `GET /v1/ping`), each request without credentials
/// acting as the key in `key_file` (read at each request, so a new key takes effect without
/// a restart). Anyone who reaches the listener runs code as that key: bind it to loopback or
/// to an address only the training job reaches, and give the key `fncall.run` on one
/// project and nothing more (see docs/fncall.md).
pub fn keyless_router(c: std::sync::Arc<Control>, key_file: std::path::PathBuf) -> axum::Router {
    use axum::routing::{get, post};
    let key_file = std::sync::Arc::new(key_file);
    let inject = move |mut req: axum::extract::Request, next: axum::middleware::Next| {
        let key_file = key_file.clone();
        async move {
            // Anyone may call here: no one acts on behalf of another key.
            req.headers_mut()
                .remove(warren_types::project::ON_BEHALF_HEADER);
            let h = req.headers();
            if !h.contains_key(axum::http::header::AUTHORIZATION) && !h.contains_key("x-api-key") {
                let key = tokio::fs::read_to_string(&*key_file).await.map_err(|e| {
                    tracing::error!(file = %key_file.display(), "the run_code listener's key: {e}");
                    Error(ApiError::new(
                        ErrorCode::Unavailable,
                        "this listener's key file cannot be read; see the server's log",
                    ))
                })?;
                let value = axum::http::HeaderValue::from_str(&format!("Bearer {}", key.trim()))
                    .map_err(|_| {
                        Error(ApiError::new(
                            ErrorCode::Unavailable,
                            "this listener's key file does not hold a key",
                        ))
                    })?;
                req.headers_mut()
                    .insert(axum::http::header::AUTHORIZATION, value);
            }
            Ok::<_, Error>(next.run(req).await)
        }
    };
    axum::Router::new()
        .route("/run_code", post(run_code))
        .route_layer(axum::middleware::from_fn_with_state(
            c.clone(),
            super::access::authorize,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(super::MAX_JSON_BODY))
        .route("/v1/ping", get(|| async { Json("pong") }))
        .layer(axum::middleware::from_fn(inject))
        .fallback(warren_http::not_found)
        .layer(axum::middleware::from_fn(warren_http::drain::unread_body))
        .with_state(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkers_judge_as_documented() {
        assert!(matches(&Checker::Exact, "1 2\n", "1 2\n"));
        assert!(!matches(&Checker::Exact, "1 2", "1 2\n"));
        assert!(matches(&Checker::Whitespace, " 1\t2\n\n", "1 2"));
        assert!(!matches(&Checker::Whitespace, "1 2 3", "1 2"));
        let f = |t| Checker::Float { tolerance: t };
        assert!(matches(&f(None), "0.3333333", "0.33333333"));
        assert!(
            matches(&f(Some(1e-3)), "1000.5 x", "1000 x"),
            "relative to the expected"
        );
        assert!(!matches(&f(Some(1e-3)), "1.01", "1"));
        assert!(!matches(&f(None), "1 2", "1"), "word counts differ");
        assert!(!matches(&f(None), "nan", "1"));
        assert!(matches(&f(None), "abc", "abc"));
    }

    #[test]
    fn a_node_that_ran_a_kind_of_call_is_warm_for_it_only() {
        let w = WarmCalls::default();
        let k = ("host".to_string(), 512u64 << 20);
        assert!(!w.warm(&k, "node01"));
        w.ran(k.clone(), "node01");
        assert!(w.warm(&k, "node01"));
        assert!(!w.warm(&k, "node02"));
        assert!(!w.warm(&("host".to_string(), 64 << 20), "node01"));
    }

    #[test]
    fn languages_have_their_files_and_aliases() {
        assert_eq!(lang("nodejs").unwrap().name, "javascript");
        assert_eq!(lang("python3").unwrap().file, "main.py");
        assert!(lang("cobol").is_none());
        assert!(one_binary(lang("c").unwrap()) && !one_binary(lang("java").unwrap()));
        assert!(check_path("a/b.txt").is_ok());
        for bad in ["", "/etc/x", "a/../b", "./a", "a//b", "a\0b"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }
}
