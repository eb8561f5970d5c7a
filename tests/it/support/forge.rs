//! A test forge: an HTTP server on 127.0.0.1 that takes commit statuses and serves pull
//! request comments (list, create, edit) as GitHub or Gitea/Forgejo do, and checks every call
//! against the vendored API descriptions in tests/forge/ (see PROVENANCE.md there): the
//! method and path template of the operation, the query parameters it declares, the
//! `Authorization` header's scheme and token, and the JSON body against the operation's
//! request schema (required keys, types, `enum`, Gitea's documented states). A call that
//! does not match is answered 4xx (404, 405, 401 or 422, as the forges do) and recorded with
//! why, so a test sees both what was sent and whether it was valid. GitHub's comment list is
//! paged (`per_page`, `page`, a `Link` header with `rel="next"`); Gitea's answers every
//! comment at once, as its handler does.

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
        let files = match self {
            Api::GitHub => ["github-statuses.json", "github-comments.json"],
            Api::Gitea => ["gitea-statuses.json", "gitea-comments.json"],
        };
        let read = |file: &str| -> Value {
            let path = super::repo_root().join("tests/forge").join(file);
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
        };
        // One description: the statuses file with the comments file's paths and
        // definitions added.
        let mut merged = read(files[0]);
        let more = read(files[1]);
        for key in ["paths", "definitions"] {
            if let Some(extra) = more[key].as_object() {
                let target = merged[key].as_object_mut();
                match target {
                    Some(target) => target.extend(extra.clone()),
                    None => merged[key] = Value::Object(extra.clone()),
                }
            }
        }
        merged
    }
}

/// One call the forge got.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) method: String,
    pub(crate) path: String,
    /// The query string (empty without one).
    pub(crate) query: String,
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
    /// Comments by (issue number, id, body), in creation order.
    comments: Mutex<Vec<(u64, u64, String)>>,
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
            comments: Mutex::default(),
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

    /// The comments of pull request (issue) `number`: (id, body), oldest first.
    pub(crate) fn comments_on(&self, number: u64) -> Vec<(u64, String)> {
        self.shared
            .comments
            .lock()
            .unwrap()
            .iter()
            .filter(|(issue, _, _)| *issue == number)
            .map(|(_, id, body)| (*id, body.clone()))
            .collect()
    }

    /// Adds a comment by someone else to pull request `number`; its id.
    pub(crate) fn add_comment(&self, number: u64, body: &str) -> u64 {
        let mut comments = self.shared.comments.lock().unwrap();
        let id = 1000 + comments.len() as u64;
        comments.push((number, id, body.to_owned()));
        id
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
    let query = uri.query().unwrap_or("").to_owned();
    let verdict = check(
        &shared,
        &method,
        uri.path(),
        &query,
        &headers,
        &authorization,
        &parsed,
    );
    let configured = shared.answer.load(Ordering::SeqCst);
    let (answered, reply, link) = match &verdict {
        Err((status, _)) => (*status, Value::Object(Default::default()), None),
        Ok(operation) if (200..300).contains(&configured) => {
            serve(&shared, operation, uri.path(), &query, &parsed)
        }
        Ok(_) => (configured, Value::Object(Default::default()), None),
    };
    shared.calls.lock().unwrap().push(Call {
        method: method.to_string(),
        path: uri.path().to_owned(),
        query,
        authorization,
        body: parsed,
        answered,
        invalid: verdict.err().map(|(_, why)| why),
    });
    let mut response = (
        StatusCode::from_u16(answered).unwrap(),
        [("content-type", "application/json")],
        reply.to_string(),
    )
        .into_response();
    if let Some(link) = link {
        response.headers_mut().insert("link", link.parse().unwrap());
    }
    if let Some(location) = shared.location.lock().unwrap().clone() {
        response
            .headers_mut()
            .insert("location", location.parse().unwrap());
    }
    response
}

/// What a valid call gets: the operation's own answer (comments listed, created or edited;
/// a status taken), with GitHub's `Link` header on a list that has more pages.
fn serve(
    shared: &Shared,
    operation: &str,
    path: &str,
    query: &str,
    body: &Value,
) -> (u16, Value, Option<String>) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let last_number = || segments.iter().rev().find_map(|s| s.parse::<u64>().ok());
    let mut comments = shared.comments.lock().unwrap();
    let as_json = |id: u64, text: &str| serde_json::json!({"id": id, "body": text});
    match operation {
        "issues/list-comments" | "issueGetComments" => {
            let issue = last_number().unwrap_or(0);
            let all: Vec<Value> = comments
                .iter()
                .filter(|(i, _, _)| *i == issue)
                .map(|(_, id, text)| as_json(*id, text))
                .collect();
            if shared.api == Api::Gitea {
                return (200, Value::Array(all), None);
            }
            let param = |name: &str, default: usize| {
                form_urlencoded::parse(query.as_bytes())
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| v.parse::<usize>().ok())
                    .unwrap_or(default)
            };
            let (per_page, page) = (param("per_page", 30), param("page", 1).max(1));
            let start = (page - 1) * per_page;
            let slice: Vec<Value> = all.iter().skip(start).take(per_page).cloned().collect();
            let link = (start + per_page < all.len()).then(|| {
                format!(
                    "<http://forge.invalid{path}?per_page={per_page}&page={}>; rel=\"next\"",
                    page + 1
                )
            });
            (200, Value::Array(slice), link)
        }
        "issues/create-comment" | "issueCreateComment" => {
            let issue = last_number().unwrap_or(0);
            let id = 1 + comments.iter().map(|(_, id, _)| *id).max().unwrap_or(0);
            let text = body["body"].as_str().unwrap_or("").to_owned();
            comments.push((issue, id, text.clone()));
            (201, as_json(id, &text), None)
        }
        "issues/update-comment" | "issueEditComment" => {
            let id = last_number().unwrap_or(0);
            match comments.iter_mut().find(|(_, c, _)| *c == id) {
                Some(comment) => {
                    comment.2 = body["body"].as_str().unwrap_or("").to_owned();
                    (200, as_json(id, &comment.2), None)
                }
                None => (404, serde_json::json!({"message": "Not Found"}), None),
            }
        }
        _ => (201, Value::Object(Default::default()), None),
    }
}

/// Checks one call against the description: `Err((status, why))` when it does not match.
/// `Ok` names the operation (its `operationId`).
fn check(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    authorization: &str,
    body: &Value,
) -> Result<String, (u16, String)> {
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
    let operation_id = operation["operationId"].as_str().unwrap_or("").to_owned();
    let parameters = operation["parameters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let Some(declared) = parameters
            .iter()
            .find(|p| p["in"] == "query" && p["name"] == name.as_ref())
        else {
            return Err((
                422,
                format!("query parameter `{name}` is not declared by {operation_id}"),
            ));
        };
        let maximum = declared["schema"]["maximum"]
            .as_u64()
            .or(declared["maximum"].as_u64());
        if let Some(maximum) = maximum
            && value.parse::<u64>().map_or(true, |v| v > maximum)
        {
            return Err((422, format!("`{name}={value}` is over {maximum}")));
        }
    }
    if method == Method::GET {
        return Ok(operation_id);
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
            let body = parameters.iter().find(|p| p["in"] == "body").unwrap();
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
    Ok(operation_id)
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
