//! The OpenAPI document, generated from the handlers' annotations and the types' schemas.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api;

#[derive(OpenApi)]
#[openapi(
    info(title = "Warren API", description = "Sandboxes for agentic reinforcement learning. Authenticate with `Authorization: Bearer <key>` (or `X-API-Key`). Errors are `{\"error\": {\"code\", \"message\"}}` with a stable code."),
    paths(
        api::system::health, api::system::nodes, api::system::openapi,
        api::sandboxes::create, api::sandboxes::list, api::sandboxes::get, api::sandboxes::kill,
        api::sandboxes::pause, api::sandboxes::resume, api::sandboxes::set_timeout,
        api::sandboxes::trajectory, api::tasks::act, api::tasks::list,
        api::commands::exec, api::commands::start, api::commands::list, api::commands::get,
        api::commands::forget, api::commands::wait, api::commands::signal, api::commands::output,
        api::files::read, api::files::write, api::files::remove, api::files::list, api::files::stat,
        api::files::mkdir, api::files::rename, api::files::download_tar, api::files::upload_tar,
        api::images::import, api::images::list, api::images::get, api::images::remove,
        api::images::stats, api::images::commit, api::images::pull,
        api::events::list,
    ),
    modifiers(&Security),
    tags(
        (name = "sandboxes", description = "Create, list, pause, resume and kill sandboxes."),
        (name = "tasks", description = "Pause, resume or stop every sandbox of a training task at once."),
        (name = "commands", description = "Run commands: exec and background processes."),
        (name = "files", description = "Move files in and out of sandboxes."),
        (name = "images", description = "Layered images: import, inspect, remove, build (commit), read statistics."),
        (name = "events", description = "Incident events: what sandboxes tried that the platform stopped or cut."),
        (name = "system", description = "Health, nodes, this document."),
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
}
