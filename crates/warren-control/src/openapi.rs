//! The OpenAPI document, generated from the handlers' annotations and the types' schemas.

use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, ArrayBuilder, KnownFormat, ObjectBuilder, OneOfBuilder,
    Schema, SchemaFormat, Type,
};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::api;

#[derive(OpenApi)]
#[openapi(
    info(title = "Warren API", description = "Sandboxes for agentic reinforcement learning. Authenticate with `Authorization: Bearer <key>` (or `X-API-Key`). Errors are `{\"error\": {\"code\", \"message\"}}` with a stable code."),
    paths(
        api::system::health, api::system::nodes, api::system::openapi,
        api::cluster::register, api::cluster::cordon, api::cluster::uncordon, api::cluster::remove,
        api::sandboxes::create, api::sandboxes::list, api::sandboxes::get, api::sandboxes::kill,
        api::sandboxes::pause, api::sandboxes::resume, api::sandboxes::set_timeout,
        api::sandboxes::trajectory, api::sandboxes::metrics, api::sandboxes::get_network, api::sandboxes::set_network,
        api::ports::connect,
        api::tasks::act, api::tasks::list, api::tasks::set_network,
        api::commands::exec, api::commands::start, api::commands::list, api::commands::get,
        api::commands::forget, api::commands::wait, api::commands::signal, api::commands::output,
        api::commands::stdin, api::commands::resize,
        api::files::read, api::files::write, api::files::remove, api::files::list, api::files::stat,
        api::files::mkdir, api::files::rename, api::files::download_tar, api::files::upload_tar,
        api::files::watch_create, api::files::watch_events, api::files::watch_remove,
        api::images::import, api::images::list, api::images::get, api::images::remove,
        api::images::stats, api::images::commit, api::images::pull, api::images::layers,
        api::images::prune,
        api::events::list,
        api::iam::whoami, api::iam::list_projects, api::iam::create_project,
        api::iam::delete_project, api::iam::set_quota, api::iam::list_identities,
        api::iam::create_identity, api::iam::list_bindings, api::iam::grant,
        api::iam::revoke_grant, api::iam::list_keys, api::iam::create_key, api::iam::revoke_key,
        api::iam::audit,
        api::fncall::run, api::fncall::batch, api::fncall::languages, api::fncall::run_code,
    ),
    modifiers(&Security, &Contract),
    tags(
        (name = "sandboxes", description = "Create, list, pause, resume and kill sandboxes."),
        (name = "tasks", description = "Pause, resume or stop every sandbox of a training task at once."),
        (name = "network", description = "What sandboxes may reach: deny by default, allow by domain, CIDR and port; changed at run time for one sandbox or a whole task."),
        (name = "commands", description = "Run commands: exec and background processes."),
        (name = "files", description = "Move files in and out of sandboxes."),
        (name = "images", description = "Layered images: import, inspect, remove, build (commit), read statistics."),
        (name = "events", description = "Incident events: what sandboxes tried that the platform stopped or cut."),
        (name = "system", description = "Health, nodes, this document."),
        (name = "fncall", description = "Function calls: a program run once on a warm worker (online judges, rewards), and SandboxFusion's /run_code."),
        (name = "iam", description = "Projects, identities, keys, grants, quotas and the audit log: who may do what where."),
    )
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let c = doc.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "x_api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// The answers every operation of a kind can give, added to each where its own annotation
/// does not already describe them, so the document names every status the server sends: a
/// missing or wrong key (401), a malformed parameter or body (400), a body over the limit
/// (413), a URI too long for the server to read (414), and for requests about a sandbox, an
/// unknown one (404), one that stopped meanwhile (410) and a node that does not answer (503).
/// Raw request bodies (files, tar streams, image archives) are bytes, every `{id}` is a
/// sandbox id, and the rules the server checks that the types' schemas cannot say are added
/// to them (paths, environment and label names, exactly one of `cmd` and `argv`).
struct Contract;

/// What a sandbox id looks like (`warren_types::id`): its node's 6 characters, then 14.
const SANDBOX_ID_PATTERN: &str = "^[a-z][a-z0-9]{19}$";

/// What a node id looks like (`warren_types::id::NodeId`).
const NODE_ID_PATTERN: &str = "^[a-z][a-z0-9]{5}$";

/// A path in a sandbox (`warren_types::path::check_user_path`): no NUL and no `..` component
/// (a component is empty, `.`, or does not start with `..` unless longer than two).
const PATH_PATTERN: &str = r"^(|\.|[^/.\u0000][^/\u0000]*|\.[^/.\u0000][^/\u0000]*|\.\.[^/\u0000]+)(/(|\.|[^/.\u0000][^/\u0000]*|\.[^/.\u0000][^/\u0000]*|\.\.[^/\u0000]+))*$";

/// Environment variable names (`warren_node::create::check_env`).
const ENV_NAME_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

/// Label keys (`warren_node::create::validate`).
const LABEL_KEY_PATTERN: &str = "^[A-Za-z0-9._:/-]{1,63}$";

/// An identity's name (`iam::model::check_identity`).
const IDENTITY_PATTERN: &str = "^[a-z0-9._@-]{1,63}$";

/// A key's name: 1 to 63 characters, none a control character.
const KEY_NAME_PATTERN: &str = r"^[^\u0000-\u001f\u007f-\u009f]{1,63}$";

/// A string without NUL.
const NO_NUL_PATTERN: &str = r"^[^\u0000]*$";

impl Modify for Contract {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for (path, item) in doc.paths.paths.iter_mut() {
            let ops = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ];
            for op in ops.into_iter().flatten() {
                complete(path, op);
            }
        }
        if let Some(c) = doc.components.as_mut() {
            let schemas = &mut c.schemas;
            for (name, field) in [
                ("CreateSandbox", "env"),
                ("ExecRequest", "env"),
                ("CreateSandbox", "labels"),
            ] {
                let names = if field == "env" {
                    ENV_NAME_PATTERN
                } else {
                    LABEL_KEY_PATTERN
                };
                if let Some(map) = property(schemas, name, field) {
                    map.max_properties = Some(if field == "env" { 256 } else { 64 });
                    map.property_names = Some(Box::new(string(names, None)));
                    let max = (field == "labels").then_some(256);
                    map.additional_properties = Some(Box::new(AdditionalProperties::RefOr(
                        RefOr::T(string(NO_NUL_PATTERN, max)),
                    )));
                }
            }
            for (name, field) in [
                ("ExecRequest", "cwd"),
                ("MkdirRequest", "path"),
                ("RenameRequest", "from"),
                ("RenameRequest", "to"),
            ] {
                if let Some(p) = property(schemas, name, field) {
                    p.pattern = Some(PATH_PATTERN.into());
                    p.min_length = Some(1);
                    p.max_length = Some(warren_types::path::MAX_PATH_LEN);
                }
            }
            // Project paths, identities, key names, roles and identity kinds, as IAM checks
            // them.
            let project = warren_types::project::PATH_PATTERN;
            let grants: Vec<String> = crate::iam::model::roles()
                .into_iter()
                .map(|(r, _, _)| r.to_string())
                .chain(
                    crate::iam::model::ALL_PERMS
                        .iter()
                        .map(|p| p.name().replace('.', "\\.")),
                )
                .collect();
            let grant = format!("^({})$", grants.join("|"));
            for (name, field, pattern) in [
                ("CreateProject", "path", project),
                ("CreateIdentity", "project", project),
                ("CreateKey", "project", project),
                ("CreateKey", "identity", IDENTITY_PATTERN),
                ("CreateKey", "name", KEY_NAME_PATTERN),
                ("GrantRequest", "project", project),
                ("GrantRequest", "identity", IDENTITY_PATTERN),
                ("CreateSandbox", "project", project),
                ("FnCallRequest", "project", project),
                ("FnCallBatchRequest", "project", project),
                ("GrantRequest", "grant", &grant),
                ("CreateKey", "role", &grant),
                ("CreateIdentity", "kind", "^(user|service)$"),
                ("CreateKey", "form", "^(warren|e2b)$"),
            ] {
                if let Some(p) = property(schemas, name, field) {
                    p.pattern = Some(pattern.into());
                }
            }
            // Function calls' languages: the names and aliases `api/fncall.rs` knows.
            let langs = format!(
                "^({})$",
                api::fncall::language_names()
                    .iter()
                    .map(|n| n.replace('+', "\\+"))
                    .collect::<Vec<_>>()
                    .join("|")
            );
            for (name, field) in [
                ("FnCallRequest", "language"),
                ("FnCallBatchRequest", "language"),
                ("RunCodeRequest", "language"),
            ] {
                if let Some(p) = property(schemas, name, field) {
                    p.pattern = Some(langs.clone());
                }
            }
            if let Some(p) = property(schemas, "CreateKey", "expires_in") {
                p.minimum = Some(1.into());
                p.maximum = Some((api::iam::MAX_EXPIRES_IN as f64).into());
            }
            // Exactly one of `cmd` (a string) and `argv` (a program and its arguments).
            if let Some(RefOr::T(exec)) = schemas.remove("ExecRequest") {
                let one = |f: &str, s: Schema| {
                    ObjectBuilder::new()
                        .schema_type(Type::Object)
                        .required(f)
                        .property(f, s)
                };
                let cmd = string(NO_NUL_PATTERN, None);
                let argv = Schema::Array(
                    ArrayBuilder::new()
                        .items(RefOr::T(string(NO_NUL_PATTERN, None)))
                        .min_items(Some(1))
                        .build(),
                );
                let both = AllOfBuilder::new()
                    .item(exec)
                    .item(
                        OneOfBuilder::new()
                            .item(one("cmd", cmd))
                            .item(one("argv", argv)),
                    )
                    .build();
                schemas.insert("ExecRequest".into(), RefOr::T(Schema::AllOf(both)));
            }
        }
    }
}

/// The schema of `field` of the object schema `name`, unwrapping an `Option`'s `oneOf`/`null`
/// form where it has one.
fn property<'a>(
    schemas: &'a mut std::collections::BTreeMap<String, RefOr<Schema>>,
    name: &str,
    field: &str,
) -> Option<&'a mut utoipa::openapi::schema::Object> {
    let Some(RefOr::T(Schema::Object(o))) = schemas.get_mut(name) else {
        return None;
    };
    match o.properties.get_mut(field)? {
        RefOr::T(Schema::Object(p)) => Some(p),
        _ => None,
    }
}

/// A string schema with `pattern` and at most `max_length` characters.
fn string(pattern: &str, max_length: Option<usize>) -> Schema {
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(pattern))
            .max_length(max_length)
            .build(),
    )
}

fn complete(path: &str, op: &mut Operation) {
    let mut add = |status: &str, resp: RefOr<Response>| {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert(resp);
    };
    if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
        add(
            "401",
            error("No API key, or one that is not valid: the message says which."),
        );
        add(
            "403",
            error("The key does not hold the permission this needs there: the message names it."),
        );
    }
    let has_params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
    if has_params || op.request_body.is_some() {
        add(
            "400",
            error("A malformed or out-of-range parameter or body: the message says which."),
        );
    }
    if op.request_body.is_some() {
        add("413", error("The body is larger than allowed."));
    }
    if path.starts_with("/v1/sandboxes/{id}") {
        add(
            "404",
            error("No such sandbox (or process, or file: the code says which)."),
        );
        add("410", error("The sandbox stopped while the request ran."));
        add(
            "503",
            error("The sandbox's node does not answer: retry after a moment."),
        );
    }
    add(
        "414",
        RefOr::T(
            ResponseBuilder::new()
                .description("The URI is too long for the server to read (no body).")
                .build(),
        ),
    );
    for p in op.parameters.iter_mut().flatten() {
        if p.parameter_in == ParameterIn::Query && p.name == "path" {
            p.schema = Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(PATH_PATTERN))
                    .min_length(Some(1))
                    .max_length(Some(warren_types::path::MAX_PATH_LEN))
                    .into(),
            );
        }
        if p.parameter_in == ParameterIn::Path && p.name == "id" {
            p.schema = Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(SANDBOX_ID_PATTERN))
                    .into(),
            );
        }
        if (p.parameter_in == ParameterIn::Path && p.name == "path")
            || (p.parameter_in == ParameterIn::Query && p.name == "project")
        {
            p.schema = Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(warren_types::project::PATH_PATTERN))
                    .into(),
            );
        }
        if p.parameter_in == ParameterIn::Path && p.name == "node" {
            p.schema = Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(NODE_ID_PATTERN))
                    .into(),
            );
        }
    }
    if let Some(body) = op.request_body.as_mut() {
        for (mime, content) in body.content.iter_mut() {
            if mime != "application/json" {
                content.schema = Some(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
                        .into(),
                );
            }
        }
    }
}

/// An answer with the JSON error body.
fn error(description: &str) -> RefOr<Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build(),
    )
}

/// The document as pretty JSON.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc.to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checked-in document is the generated one: the wire contract changes only on purpose.
    #[test]
    fn checked_in_document_matches_the_code() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        let generated = document() + "\n";
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "docs/openapi.json differs from the API the code serves: if the change is intended, run `UPDATE_OPENAPI=1 cargo test -p warren-control openapi` and commit the file"
        );
    }

    /// Every documented route that needs a key has an entry in the access table, and the
    /// table names no route the API does not have: a route cannot be added without deciding
    /// who may call it (one missing is refused to every key, which this catches first).
    #[test]
    fn every_route_has_its_permission() {
        // Parameters' names differ between the document and the router: compare shapes.
        fn shape(route: &str) -> String {
            route
                .split('/')
                .map(|seg| if seg.starts_with('{') { "{}" } else { seg })
                .collect::<Vec<_>>()
                .join("/")
        }
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let open = ["/v1/health", "/v1/openapi.json", "/v1/cluster/nodes"];
        let table: std::collections::BTreeMap<(String, String), &str> = api::access::table()
            .into_iter()
            .map(|(m, r)| ((m.to_string(), shape(r)), r))
            .collect();
        let mut documented = std::collections::BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            if open.contains(&path.as_str()) {
                continue;
            }
            for method in ops.as_object().unwrap().keys() {
                let m: axum::http::Method = method.to_uppercase().parse().unwrap();
                let key = (m.to_string(), shape(path));
                let route = table
                    .get(&key)
                    .unwrap_or_else(|| panic!("{m} {path} has no entry in api/access.rs"));
                assert!(api::access::need(&m, route).is_some());
                documented.insert(key);
            }
        }
        for (m, route) in table.keys() {
            assert!(
                documented.contains(&(m.clone(), route.clone())),
                "api/access.rs names {m} {route}, which the API does not document"
            );
        }
    }
}
