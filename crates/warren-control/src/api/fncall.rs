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
    FnCallRequest, FnCallResult, FnCallStatus, LanguageInfo, LanguageList, NodeCall,
    NodeCallResult, StepOutcome,
};
use warren_types::guest::{CallFile, CallSpec, CallStep, StepResult};

use super::S;
use crate::Control;
use crate::iam::{Perm, Principal};
use crate::node_api::CallError;
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

fn invalid(m: impl Into<String>) -> Error {
    Error(ApiError::invalid(m))
}

fn seconds(v: Option<f64>, default: f64, what: &str) -> Result<Duration, Error> {
    let s = v.unwrap_or(default);
    if !(s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT) {
        return Err(invalid(format!(
            "{what} {s} is not a number of seconds above 0 and at most {MAX_TIMEOUT}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
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
    let memory = req.memory.map_or(512 << 20, |m| m.bytes());
    if !(MIN_MEMORY..=MAX_MEMORY).contains(&memory) {
        return Err(invalid(format!(
            "memory {} is outside 16Mi to 16Gi",
            warren_types::ByteSize(memory)
        )));
    }
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

/// Runs a planned call on a node: power-of-k over the nodes that take containers, the next
/// candidate when one is full.
async fn dispatch(c: &Control, p: &Planned) -> Result<(NodeCallResult, String), Error> {
    let nodes = c.nodes.snapshot();
    if nodes.is_empty() {
        return Err(Error(ApiError::new(
            ErrorCode::Unavailable,
            "no nodes are registered: start a node daemon (warren node --join URL)",
        )));
    }
    let selector = BTreeMap::new();
    let ask = scheduler::Ask {
        memory: p.call.memory.bytes(),
        cpu: 1000,
        backend: warren_types::api::BackendKind::Container,
        selector: &selector,
        burst_above: None,
    };
    let order = scheduler::candidates(
        &nodes,
        c.cfg.schedule_k,
        c.cfg.schedule_attempts,
        &ask,
        None,
        &mut rand::rng(),
    );
    let budget: Duration = p
        .call
        .spec
        .steps
        .iter()
        .map(|s| Duration::from_millis(s.timeout_ms))
        .sum::<Duration>()
        + Duration::from_secs(90);
    let mut last = None;
    for node in &order {
        match node.api().fncall(&p.call, budget).await {
            Ok(r) => return Ok((r, node.id.to_string())),
            Err(CallError::Refused(e))
                if matches!(e.code, ErrorCode::Capacity | ErrorCode::Unavailable) =>
            {
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

/// What a node's answer means.
fn judge(p: &Planned, answer: NodeCallResult, node: String) -> Result<FnCallResult, Error> {
    let steps = &answer.result.steps;
    // A toolchain the image lacks is the request's problem (this image cannot run this
    // language), not the program's.
    if let Some(why) = steps.iter().find_map(|s| s.not_started.as_deref()) {
        return Err(invalid(format!(
            "language {} needs `{}`, which image {} cannot run ({why}); use an image that has \
             it (`image`), or another language",
            p.lang.name, p.lang.needs, p.call.image
        )));
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
    let failed = |s: &StepResult| s.exit_code != Some(0);
    let status = match (compile, run) {
        (Some(c), _) if failed(c) => FnCallStatus::CompileError,
        (_, None) => FnCallStatus::CompileError,
        (_, Some(r)) if r.timed_out => FnCallStatus::Timeout,
        (_, Some(r)) if r.output_limit => FnCallStatus::OutputLimit,
        // The worker's OOM count rose during the call and the run did not succeed: it ran out
        // of memory (the kernel killed it, or an allocation failed on the way there).
        (_, Some(r)) if failed(r) && answer.memory_limit => FnCallStatus::MemoryLimit,
        (_, Some(r)) if failed(r) => FnCallStatus::RuntimeError,
        _ => FnCallStatus::Ok,
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
/// the image's layers.
async fn authorize(
    c: &Control,
    who: &Principal,
    project: Option<&str>,
    p: &mut Planned,
) -> Result<(), Error> {
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
    if p.call.image.trim() != "host" {
        p.call.resolved = Some(
            c.catalog
                .resolve_for(&p.call.image, &project)
                .await
                .map_err(super::images::image_error)?,
        );
    }
    Ok(())
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
        (status = 429, description = "No node has room: retry after Retry-After seconds.", body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn run(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<Principal>>,
    Json(req): Json<FnCallRequest>,
) -> Result<Json<FnCallResult>, Error> {
    let mut p = plan(&c, &req)?;
    authorize(&c, &who, req.project.as_deref(), &mut p).await?;
    let (answer, node) = dispatch(&c, &p).await?;
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
    /// Memory in MiB (-1 or absent: 1024).
    #[serde(default, rename = "memory_limit_MB")]
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
/// lacks, bad input) is a 4xx with Warren's error, which the client reports. The key comes as
/// `Authorization: Bearer`, `X-API-Key`, or HTTP Basic credentials in the URL
/// (`http://fncall:KEY@host:port`, the only way the `sandbox-fusion` client can send one).
#[utoipa::path(post, path = "/run_code", tag = "fncall",
    request_body = RunCodeRequest,
    responses((status = 200, body = RunCodeResponse),
        (status = 400, description = "Bad request, unknown language, or a toolchain the image lacks.", body = ErrorBody),
        (status = 413, description = "Code or files too large.", body = ErrorBody),
        (status = 429, description = "No node has room: retry after Retry-After seconds.", body = ErrorBody),
        (status = 503, description = "No node answered.", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn run_code(
    axum::extract::State(c): S,
    axum::Extension(who): axum::Extension<std::sync::Arc<Principal>>,
    Json(req): Json<RunCodeRequest>,
) -> Result<Json<RunCodeResponse>, Error> {
    let memory = match req.memory_limit_mb {
        None | Some(-1) => 1024 << 20,
        Some(m) if (16..=16384).contains(&m) => (m as u64) << 20,
        Some(m) => {
            return Err(invalid(format!(
                "memory_limit_MB {m} is outside 16 to 16384 (or -1 for the default, 1024)"
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
    };
    let mut p = plan(&c, &ours)?;
    authorize(&c, &who, None, &mut p).await?;
    let (answer, node) = dispatch(&c, &p).await?;
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
