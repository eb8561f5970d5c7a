//! A test forge: an HTTP server on 127.0.0.1 that takes commit statuses as GitHub or
//! Gitea/Forgejo do and checks every call against the vendored API descriptions in
//! tests/forge/ (see PROVENANCE.md there): the method and path template of the operation,
//! the `Authorization` header's scheme and token, and the JSON body against the
//! operation's request schema (required keys, types, `enum`, Gitea's documented states). A
//! call that does not match is answered 4xx (404, 405, 401 or 422, as the forges do) and
//! recorded with why, so a test sees both what was sent and whether it was valid.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use serde_json::Value;

/// Which API the forge speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    GitHub,
    Gitea,
}

impl Api {
    fn description(self) -> Value {
        let file = match self {
            Api::GitHub => "github-statuses.json",
            Api::Gitea => "gitea-statuses.json",
        };
        let path = super::repo_root().join("tests/forge").join(file);
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }
}

/// One call the forge got.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) authorization: String,
    pub(crate) body: Value,
    /// The status answered.
    pub(crate) answered: u16,
    /// Why the call did not match the description; `None`: it did.
    pub(crate) invalid: Option<String>,
}

impl Call {
    /// The status's commit (the last path segment).
    pub(crate) fn sha(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }
    pub(crate) fn state(&self) -> &str {
        self.body["state"].as_str().unwrap_or("")
    }
    pub(crate) fn description(&self) -> &str {
        self.body["description"].as_str().unwrap_or("")
    }
}

struct Shared {
    api: Api,
    description: Value,
    /// The path prefix of the API (`/api/v1` for Gitea).
    base: String,
    token: String,
    answer: AtomicU16,
    location: Mutex<Option<String>>,
    calls: Mutex<Vec<Call>>,
}

/// The running forge.
pub(crate) struct TestForge {
    pub(crate) addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestForge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestForge {
    /// A forge on a free port that accepts `token`.
    pub(crate) async fn start(api: Api, token: &str) -> TestForge {
        Self::start_on(api, token, "127.0.0.1:0".parse().unwrap()).await
    }

    /// A forge on `addr` (a port reserved while the forge was "down").
    pub(crate) async fn start_on(api: Api, token: &str, addr: SocketAddr) -> TestForge {
        let description = api.description();
        let base = description["basePath"].as_str().unwrap_or("").to_owned();
        let shared = Arc::new(Shared {
            api,
            description,
            base,
            token: token.to_owned(),
            answer: AtomicU16::new(201),
            location: Mutex::default(),
            calls: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        TestForge { addr, shared, task }
    }

    /// The `api_url` to configure.
    pub(crate) fn api_url(&self) -> String {
        format!("http://{}{}", self.addr, self.shared.base)
    }

    /// Answers later valid calls with `status` (201 at first).
    pub(crate) fn answer(&self, status: u16) {
        self.shared.answer.store(status, Ordering::SeqCst);
    }

    /// Answers later calls with a redirect (`status`) to `location`.
    pub(crate) fn redirect(&self, status: u16, location: &str) {
        *self.shared.location.lock().unwrap() = Some(location.to_owned());
        self.answer(status);
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.shared.calls.lock().unwrap().clone()
    }

    /// The calls accepted (valid and answered 2xx), in order.
    pub(crate) fn accepted(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.invalid.is_none() && (200..300).contains(&c.answered))
            .collect()
    }

    /// Waits until an accepted call satisfies `done`; that call.
    pub(crate) async fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&Call) -> bool,
        log: impl Fn() -> String,
    ) -> Call {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(call) = self.accepted().into_iter().find(|c| done(c)) {
                return call;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} status reached the forge; calls: {:#?}\nagent log:\n{}",
                self.calls(),
                log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every call matched the description.
    pub(crate) fn assert_all_valid(&self) {
        let invalid: Vec<Call> = self
            .calls()
            .into_iter()
            .filter(|c| c.invalid.is_some())
            .collect();
        assert!(
            invalid.is_empty(),
            "calls not matching the API description: {invalid:#?}"
        );
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let verdict = check(
        &shared,
        &method,
        uri.path(),
        &headers,
        &authorization,
        &parsed,
    );
    let answered = match &verdict {
        Err((status, _)) => *status,
        Ok(()) => shared.answer.load(Ordering::SeqCst),
    };
    shared.calls.lock().unwrap().push(Call {
        method: method.to_string(),
        path: uri.path().to_owned(),
        authorization,
        body: parsed,
        answered,
        invalid: verdict.err().map(|(_, why)| why),
    });
    let mut response = (StatusCode::from_u16(answered).unwrap(), "{}").into_response();
    if let Some(location) = shared.location.lock().unwrap().clone() {
        response
            .headers_mut()
            .insert("location", location.parse().unwrap());
    }
    response
}

/// Checks one call against the description: `Err((status, why))` when it does not match.
fn check(
    shared: &Shared,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    authorization: &str,
    body: &Value,
) -> Result<(), (u16, String)> {
    let Some(rest) = path.strip_prefix(&shared.base) else {
        return Err((
            404,
            format!("{path} is outside the API's base path {}", shared.base),
        ));
    };
    let paths = shared.description["paths"].as_object().unwrap();
    let (template, operations) = paths
        .iter()
        .find(|(template, _)| matches_template(template, rest))
        .ok_or_else(|| (404, format!("no operation has the path {rest}")))?;
    let operation = operations
        .get(method.as_str().to_lowercase())
        .ok_or_else(|| (405, format!("{template} has no {method} operation")))?;
    let scheme = match shared.api {
        Api::GitHub => shared.description["x-proxops-auth"]["scheme"]
            .as_str()
            .unwrap()
            .to_owned(),
        // securityDefinitions.AuthorizationHeaderToken: "prepended with \"token\"".
        Api::Gitea => "token".to_owned(),
    };
    if authorization != format!("{scheme} {}", shared.token) {
        return Err((401, format!("Authorization is not `{scheme} <token>`")));
    }
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/json") {
        return Err((
            415,
            format!("content-type {content_type:?} is not application/json"),
        ));
    }
    let schema = match shared.api {
        Api::GitHub => operation["requestBody"]["content"]["application/json"]["schema"].clone(),
        Api::Gitea => {
            let body = operation["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["in"] == "body")
                .unwrap();
            resolve(&shared.description, &body["schema"])
        }
    };
    validate(&shared.description, &schema, body, "body").map_err(|why| (422, why))?;
    if shared.api == Api::Gitea {
        let states: Vec<&str> = shared.description["x-proxops-states"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if let Some(state) = body["state"].as_str()
            && !states.contains(&state)
        {
            return Err((422, format!("state {state:?} is not one of {states:?}")));
        }
    }
    Ok(())
}

fn matches_template(template: &str, path: &str) -> bool {
    let t: Vec<&str> = template.trim_matches('/').split('/').collect();
    let p: Vec<&str> = path.trim_matches('/').split('/').collect();
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| !p.is_empty() && (t == p || (t.starts_with('{') && t.ends_with('}'))))
}

fn resolve(root: &Value, schema: &Value) -> Value {
    match schema["$ref"].as_str() {
        Some(reference) => {
            let pointer = reference.trim_start_matches('#');
            resolve(root, root.pointer(pointer).unwrap())
        }
        None => schema.clone(),
    }
}

/// The subset of JSON Schema the vendored request schemas use: `type` (one or a list),
/// `properties`, `required`, `enum`, `$ref`; unknown keys of an object are allowed, as
/// both schemas allow them.
fn validate(root: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(root, schema);
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::String(t) => vec![t.as_str()],
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let actual = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        if !types
            .iter()
            .any(|t| *t == actual || (*t == "number" && actual == "integer"))
        {
            return Err(format!("{at}: {actual} is not of type {types:?}"));
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if value.get(key).is_none() {
                return Err(format!("{at}: `{key}` is required"));
            }
        }
    }
    if let (Some(properties), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object(),
    ) {
        for (key, sub) in properties {
            if let Some(v) = object.get(key) {
                validate(root, sub, v, &format!("{at}.{key}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vendored_github_schema_refuses_an_unknown_state_and_a_missing_one() {
        let root = Api::GitHub.description();
        let schema = &root["paths"]["/repos/{owner}/{repo}/statuses/{sha}"]["post"]["requestBody"]
            ["content"]["application/json"]["schema"];
        assert!(
            validate(
                &root,
                schema,
                &serde_json::json!({"state": "success"}),
                "body"
            )
            .is_ok()
        );
        assert!(
            validate(
                &root,
                schema,
                &serde_json::json!({"state": "warning"}),
                "body"
            )
            .is_err()
        );
        assert!(validate(&root, schema, &serde_json::json!({"context": "x"}), "body").is_err());
        assert!(matches_template(
            "/repos/{owner}/{repo}/statuses/{sha}",
            "/repos/o/r/statuses/abc"
        ));
        assert!(!matches_template(
            "/repos/{owner}/{repo}/statuses/{sha}",
            "/repos/o/statuses/abc"
        ));
    }
}
