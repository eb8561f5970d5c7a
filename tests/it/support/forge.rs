//! A test forge: an HTTP server on 127.0.0.1 that takes commit statuses and serves pull
//! request comments (list, create, edit) as GitHub, Gitea or Forgejo do, and checks every
//! call against that forge's own published API description, vendored verbatim in
//! tests/forge/ (see PROVENANCE.md there): GitHub's OpenAPI 3 description, Gitea's and
//! Forgejo's swagger 2 `v1_json.tmpl`.
//!
//! [`Validator::check`] resolves `$ref`s (OpenAPI 3 `#/components/…`, swagger 2
//! `#/definitions/…` and `#/parameters/…`) and checks, in order: the path template under the
//! API's base path (404), the method (405), the `Authorization` header against the
//! description's security scheme (401), every path and query parameter against its declared
//! type, `enum` and maximum, with undeclared query keys refused (400), and the JSON body
//! against the operation's request schema: `type`, `nullable`, `enum`, `required`,
//! `properties`, `additionalProperties`, `items`, `allOf`/`oneOf`/`anyOf` (415 for a body
//! that is not JSON, 422 for one that does not match). Two rules read the descriptions' prose
//! because the schema leaves them there, and say so where they fail: GitHub's `per_page` says
//! `(max 100)` in its description, not in a `maximum`; Gitea's and Forgejo's
//! `CommitStatusState` is a plain string whose description lists the states (`It can be
//! "pending", …`). A call that does not match is answered with that 4xx and recorded with
//! why; tests assert [`TestForge::assert_all_valid`]. GitHub's comment list is paged
//! (`per_page`, `page`, a `Link` header with `rel="next"`); Gitea's and Forgejo's answer every
//! comment at once, as their handler does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use serde_json::Value;

/// Which API the forge speaks, and so which vendored description checks the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    GitHub,
    Gitea,
    Forgejo,
}

impl Api {
    /// The vendored description's file in tests/forge/.
    fn file(self) -> &'static str {
        match self {
            Api::GitHub => "github-rest.json",
            Api::Gitea => "gitea-v1.json",
            Api::Forgejo => "forgejo-v1.json",
        }
    }

    /// The vendored description, parsed.
    pub(crate) fn description(self) -> Value {
        let path = super::repo_root().join("tests/forge").join(self.file());
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// Checks calls against one forge's description.
pub(crate) struct Validator {
    api: Api,
    root: Value,
    /// The path prefix of the API: swagger 2's `basePath` (`{{AppSubUrl | JSEscape}}/api/v1`
    /// for a forge served at its host's root, so `/api/v1`); empty for GitHub.
    base: String,
    token: String,
}

impl Validator {
    pub(crate) fn new(api: Api, token: &str) -> Validator {
        let root = api.description();
        let base = root["basePath"]
            .as_str()
            .unwrap_or("")
            .replace("{{AppSubUrl | JSEscape}}", "");
        Validator {
            api,
            root,
            base,
            token: token.to_owned(),
        }
    }

    /// Checks one call: `Ok` names the operation (its `operationId`), `Err((status, why))`
    /// says what does not match the description.
    pub(crate) fn check(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<String, (u16, String)> {
        let Some(rest) = path.strip_prefix(&self.base) else {
            return Err((
                404,
                format!("{path} is outside the API's base path {}", self.base),
            ));
        };
        let (template, item) = self.path_item(rest).ok_or_else(|| {
            (
                404,
                format!("no operation of the description has the path {rest}"),
            )
        })?;
        let operation = item
            .get(method.as_str().to_lowercase())
            .ok_or_else(|| (405, format!("{template} has no {method} operation")))?;
        let id = operation["operationId"].as_str().unwrap_or("").to_owned();
        self.check_authorization(headers)?;
        let parameters: Vec<Value> = item["parameters"]
            .as_array()
            .into_iter()
            .chain(operation["parameters"].as_array())
            .flatten()
            .map(|p| self.resolve(p))
            .collect();
        self.check_path(&template, rest, &parameters, &id)?;
        self.check_query(query, &parameters, &id)?;
        match self.body_schema(operation, &parameters) {
            Some(schema) => self.check_body(operation, &schema, headers, body, &id)?,
            None if !body.is_empty() => {
                return Err((400, format!("{id} takes no body, and one was sent")));
            }
            None => {}
        }
        Ok(id)
    }

    /// The path item whose template matches `path`, preferring the one with more literal
    /// segments (`/issues/comments/{id}` before `/issues/{index}/…`).
    fn path_item(&self, path: &str) -> Option<(String, &Value)> {
        let paths = self.root["paths"].as_object()?;
        paths
            .iter()
            .filter(|(template, _)| matches_template(template, path))
            .max_by_key(|(template, _)| template.split('/').filter(|s| !s.starts_with('{')).count())
            .map(|(template, item)| (template.clone(), item))
    }

    /// The `Authorization` header against the security scheme ProxOps uses.
    fn check_authorization(&self, headers: &HeaderMap) -> Result<(), (u16, String)> {
        let sent = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let schemes: Vec<String> = match self.api {
            // The vendored cut of GitHub's description (1.1.1) declares no
            // `securitySchemes`; GitHub's REST docs ("Authenticating to the REST API") take a
            // token as `Authorization: Bearer <token>` or `Authorization: token <token>`.
            // Assumed from the docs, not from the description.
            Api::GitHub => vec!["Bearer".to_owned(), "token".to_owned()],
            // securityDefinitions.AuthorizationHeaderToken: an apiKey in the header it names,
            // "prepended with \"token\" followed by a space".
            Api::Gitea | Api::Forgejo => {
                let scheme = &self.root["securityDefinitions"]["AuthorizationHeaderToken"];
                assert_eq!(scheme["in"], "header", "AuthorizationHeaderToken");
                assert_eq!(scheme["name"], "Authorization", "AuthorizationHeaderToken");
                let description = scheme["description"].as_str().unwrap_or("");
                let prefix = description
                    .split("prepended with \"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .expect("AuthorizationHeaderToken names its prefix");
                vec![prefix.to_owned()]
            }
        };
        if schemes
            .iter()
            .any(|scheme| sent == format!("{scheme} {}", self.token))
        {
            return Ok(());
        }
        let wanted: Vec<String> = schemes.iter().map(|s| format!("`{s} <token>`")).collect();
        let what = match sent.split_once(' ') {
            Some((scheme, _)) => format!("scheme `{scheme}`"),
            None if sent.is_empty() => "no Authorization header".to_owned(),
            None => "a value without a scheme".to_owned(),
        };
        Err((
            401,
            format!(
                "Authorization must be {} with the configured token; got {what}",
                wanted.join(" or ")
            ),
        ))
    }

    /// Each `{name}` segment of the template against its declared path parameter.
    fn check_path(
        &self,
        template: &str,
        path: &str,
        parameters: &[Value],
        id: &str,
    ) -> Result<(), (u16, String)> {
        let names = template.trim_matches('/').split('/');
        let values = path.trim_matches('/').split('/');
        for (name, value) in names.zip(values) {
            let Some(name) = name.strip_prefix('{').and_then(|n| n.strip_suffix('}')) else {
                continue;
            };
            let declared = parameters
                .iter()
                .find(|p| p["in"] == "path" && p["name"] == name)
                .ok_or_else(|| {
                    (
                        500,
                        format!("{id}: the description declares no path parameter `{name}`"),
                    )
                })?;
            let value = percent_decode(value);
            self.check_scalar(declared, &value).map_err(|why| {
                (
                    404,
                    format!("{id}: path parameter `{name}`={value:?} {why}"),
                )
            })?;
        }
        Ok(())
    }

    /// Every query key declared (credentials in the query string named as such), every value
    /// of its declared type, `enum` and maximum, every required one present.
    fn check_query(
        &self,
        query: &str,
        parameters: &[Value],
        id: &str,
    ) -> Result<(), (u16, String)> {
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        for (name, value) in &pairs {
            let Some(declared) = parameters
                .iter()
                .find(|p| p["in"] == "query" && p["name"] == name.as_str())
            else {
                if let Some(scheme) = self.query_credential(name) {
                    return Err((
                        400,
                        format!(
                            "query parameter `{name}` is the security scheme {scheme}: a token in the URL; ProxOps sends it only in Authorization"
                        ),
                    ));
                }
                return Err((
                    400,
                    format!("query parameter `{name}` is not declared by {id}"),
                ));
            };
            self.check_scalar(declared, value)
                .map_err(|why| (422, format!("{id}: `{name}={value}` {why}")))?;
        }
        for required in parameters
            .iter()
            .filter(|p| p["in"] == "query" && p["required"] == true)
        {
            let name = required["name"].as_str().unwrap_or("");
            if !pairs.iter().any(|(k, _)| k == name) {
                return Err((422, format!("{id}: query parameter `{name}` is required")));
            }
        }
        Ok(())
    }

    /// The security scheme (swagger 2 `apiKey` `in: query`) whose key is `name`, if any.
    fn query_credential(&self, name: &str) -> Option<String> {
        self.root["securityDefinitions"]
            .as_object()?
            .iter()
            .find(|(_, s)| s["in"] == "query" && s["name"] == name)
            .map(|(scheme, _)| scheme.clone())
    }

    /// One path or query value (text) against its parameter: OpenAPI 3 keeps the type in
    /// `schema`, swagger 2 on the parameter itself.
    fn check_scalar(&self, parameter: &Value, value: &str) -> Result<(), String> {
        let schema = match parameter.get("schema") {
            Some(schema) => self.resolve(schema),
            None => parameter.clone(),
        };
        if value.is_empty() {
            return Err("is empty".to_owned());
        }
        let number = match schema["type"].as_str() {
            Some("integer") => Some(
                value
                    .parse::<i64>()
                    .map_err(|_| "is not an integer".to_owned())? as f64,
            ),
            Some("number") => Some(
                value
                    .parse::<f64>()
                    .map_err(|_| "is not a number".to_owned())?,
            ),
            Some("boolean") if value != "true" && value != "false" => {
                return Err("is not true or false".to_owned());
            }
            _ => None,
        };
        if let Some(allowed) = schema["enum"].as_array()
            && !allowed.iter().any(|a| a.as_str() == Some(value))
        {
            return Err(format!("is not one of {allowed:?}"));
        }
        if let Some(number) = number {
            if let Some(maximum) = declared_maximum(parameter, &schema)
                && number > maximum
            {
                return Err(format!("is over the maximum {maximum}"));
            }
            if let Some(minimum) = schema["minimum"].as_f64()
                && number < minimum
            {
                return Err(format!("is under the minimum {minimum}"));
            }
        }
        Ok(())
    }

    /// The request body's schema: OpenAPI 3 `requestBody.content["application/json"]`,
    /// swagger 2 the `in: body` parameter.
    fn body_schema(&self, operation: &Value, parameters: &[Value]) -> Option<Value> {
        if let Some(body) = operation.get("requestBody") {
            let body = self.resolve(body);
            return body["content"]["application/json"]
                .get("schema")
                .map(|s| self.resolve(s));
        }
        parameters
            .iter()
            .find(|p| p["in"] == "body")
            .map(|p| self.resolve(&p["schema"]))
    }

    fn check_body(
        &self,
        operation: &Value,
        schema: &Value,
        headers: &HeaderMap,
        body: &[u8],
        id: &str,
    ) -> Result<(), (u16, String)> {
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = content_type.split(';').next().unwrap_or("").trim();
        // OpenAPI 3 names the media types under requestBody.content; swagger 2 in the
        // operation's `consumes`, else the description's.
        let accepted: Vec<String> = match operation["requestBody"]["content"].as_object() {
            Some(content) => content.keys().cloned().collect(),
            None => operation["consumes"]
                .as_array()
                .or(self.root["consumes"].as_array())
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        };
        if !accepted.iter().any(|a| a == media) || media != "application/json" {
            return Err((
                415,
                format!(
                    "{id}: content-type {content_type:?} is not application/json (it takes {accepted:?})"
                ),
            ));
        }
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| (415, format!("{id}: the body is not JSON: {e}")))?;
        self.validate(schema, &value, "body")
            .map_err(|why| (422, format!("{id}: {why}")))
    }

    /// Follows `$ref`s (`#/…` JSON pointers into the description) until a schema without one.
    fn resolve(&self, schema: &Value) -> Value {
        let mut schema = schema.clone();
        for _ in 0..32 {
            let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
                return schema;
            };
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("{reference}: only local references are vendored"));
            schema = self
                .root
                .pointer(pointer)
                .unwrap_or_else(|| panic!("{reference} is not in {}", self.api.file()))
                .clone();
        }
        panic!("a $ref cycle in {}", self.api.file())
    }

    /// `value` against `schema` (a JSON Schema subset: what the vendored request schemas use).
    fn validate(&self, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
        let schema = self.resolve(schema);
        if let Some(all) = schema["allOf"].as_array() {
            for sub in all {
                self.validate(sub, value, at)?;
            }
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(any) = schema[key].as_array()
                && !any.iter().any(|sub| self.validate(sub, value, at).is_ok())
            {
                return Err(format!("{at}: {value} matches none of its {key}"));
            }
        }
        if value.is_null() && (schema["nullable"] == true || schema["x-nullable"] == true) {
            return Ok(());
        }
        if let Some(types) = schema.get("type") {
            let types: Vec<&str> = match types {
                Value::String(t) => vec![t.as_str()],
                Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let actual = json_type(value);
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
        if let (Some(allowed), Some(text)) = (prose_enum(&schema), value.as_str())
            && !allowed.iter().any(|a| a == text)
        {
            return Err(format!(
                "{at}: {value} is not one of the values its description lists, {allowed:?}"
            ));
        }
        if let Some(text) = value.as_str()
            && let Some(max) = schema["maxLength"].as_u64()
            && text.chars().count() as u64 > max
        {
            return Err(format!("{at}: longer than its maxLength {max}"));
        }
        if let Some(items) = schema.get("items")
            && let Some(list) = value.as_array()
        {
            for (i, item) in list.iter().enumerate() {
                self.validate(items, item, &format!("{at}[{i}]"))?;
            }
        }
        let Some(object) = value.as_object() else {
            return Ok(());
        };
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or("");
            if !object.contains_key(key) {
                return Err(format!("{at}: `{key}` is required"));
            }
        }
        let properties = schema["properties"].as_object();
        for (key, v) in object {
            match properties.and_then(|p| p.get(key)) {
                Some(sub) => self.validate(sub, v, &format!("{at}.{key}"))?,
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{at}: `{key}` is not a property it allows"));
                    }
                    Some(extra @ Value::Object(_)) => {
                        self.validate(extra, v, &format!("{at}.{key}"))?;
                    }
                    // Unstated or `true`: JSON Schema allows other keys.
                    _ => {}
                },
            }
        }
        Ok(())
    }
}

/// The JSON Schema type name of `value`.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A parameter's maximum: `maximum` on its schema (OpenAPI 3) or on itself (swagger 2), else
/// a `(max N)` in its description, which is where GitHub's description keeps `per_page`'s
/// (`Results per page (max 100)`).
fn declared_maximum(parameter: &Value, schema: &Value) -> Option<f64> {
    if let Some(maximum) = schema["maximum"].as_f64().or(parameter["maximum"].as_f64()) {
        return Some(maximum);
    }
    let description = parameter["description"].as_str()?;
    let after = description.split("(max ").nth(1)?;
    after.split(')').next()?.trim().parse().ok()
}

/// The values a string schema without `enum` lists in its description (`It can be "a", "b"
/// and "c"`): how Gitea's and Forgejo's `CommitStatusState` states its states.
fn prose_enum(schema: &Value) -> Option<Vec<String>> {
    if schema.get("enum").is_some() || schema["type"] != "string" {
        return None;
    }
    let listed = schema["description"].as_str()?.split("It can be ").nth(1)?;
    let values: Vec<String> = listed
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    (!values.is_empty()).then_some(values)
}

fn matches_template(template: &str, path: &str) -> bool {
    let t: Vec<&str> = template.trim_matches('/').split('/').collect();
    let p: Vec<&str> = path.trim_matches('/').split('/').collect();
    t.len() == p.len()
        && t.iter()
            .zip(&p)
            .all(|(t, p)| !p.is_empty() && (t == p || (t.starts_with('{') && t.ends_with('}'))))
}

fn percent_decode(segment: &str) -> String {
    form_urlencoded::parse(format!("x={segment}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
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
    /// The `operationId` the call matched (empty when it matched none).
    pub(crate) operation: String,
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
    validator: Validator,
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
        let shared = Arc::new(Shared {
            api,
            validator: Validator::new(api, token),
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
        format!("http://{}{}", self.addr, self.shared.validator.base)
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
            "calls not matching the {:?} API description: {invalid:#?}",
            self.shared.api
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
    let verdict = shared
        .validator
        .check(&method, uri.path(), &query, &headers, &body);
    let configured = shared.answer.load(Ordering::SeqCst);
    let (answered, reply, link) = match &verdict {
        Err((status, why)) => (*status, serde_json::json!({ "message": why }), None),
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
        operation: verdict.as_ref().cloned().unwrap_or_default(),
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
            if shared.api != Api::GitHub {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TOKEN: &str = "t0ken";
    const SHA: &str = "6dcb09b5b57875f334f61aebed695e2e4193db5e";

    /// The headers ProxOps sends to `api`, with a JSON body.
    fn headers(api: Api) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let scheme = if api == Api::GitHub {
            "Bearer"
        } else {
            "token"
        };
        headers.insert(
            "authorization",
            format!("{scheme} {TOKEN}").parse().unwrap(),
        );
        headers.insert("content-type", "application/json".parse().unwrap());
        headers
    }

    fn prefix(api: Api) -> &'static str {
        if api == Api::GitHub { "" } else { "/api/v1" }
    }

    fn post_status(api: Api, body: &Value) -> Result<String, (u16, String)> {
        let path = format!("{}/repos/ops/proxmox/statuses/{SHA}", prefix(api));
        Validator::new(api, TOKEN).check(
            &Method::POST,
            &path,
            "",
            &headers(api),
            body.to_string().as_bytes(),
        )
    }

    fn refused(result: Result<String, (u16, String)>, status: u16, says: &str) {
        match result {
            Err((code, why)) => {
                assert_eq!(code, status, "{why}");
                assert!(why.contains(says), "{why:?} does not say {says:?}");
            }
            Ok(operation) => panic!("accepted as {operation}; expected {status} ({says})"),
        }
    }

    #[test]
    fn every_call_proxops_makes_is_an_operation_of_each_description() {
        let status = json!({"state": "success", "description": "applied", "context": "proxops/default/pve1", "target_url": "https://proxops.example/ui/passes/1"});
        let comment = json!({"body": "<!-- proxops:plan:default/pve1 -->\nplan"});
        for api in [Api::GitHub, Api::Gitea, Api::Forgejo] {
            let v = Validator::new(api, TOKEN);
            let p = prefix(api);
            let (create, list, edit) = match api {
                Api::GitHub => (
                    "issues/create-comment",
                    "issues/list-comments",
                    "issues/update-comment",
                ),
                _ => ("issueCreateComment", "issueGetComments", "issueEditComment"),
            };
            assert!(
                post_status(api, &status).is_ok(),
                "{api:?}: {:?}",
                post_status(api, &status)
            );
            let comments = format!("{p}/repos/ops/proxmox/issues/7/comments");
            let query = if api == Api::GitHub {
                "per_page=100&page=2"
            } else {
                ""
            };
            assert_eq!(
                v.check(&Method::GET, &comments, query, &headers(api), b""),
                Ok(list.to_owned())
            );
            let body = comment.to_string();
            assert_eq!(
                v.check(&Method::POST, &comments, "", &headers(api), body.as_bytes()),
                Ok(create.to_owned())
            );
            let one = format!("{p}/repos/ops/proxmox/issues/comments/1001");
            assert_eq!(
                v.check(&Method::PATCH, &one, "", &headers(api), body.as_bytes()),
                Ok(edit.to_owned())
            );
        }
    }

    #[test]
    fn a_state_outside_the_enum_or_the_listed_states_is_refused() {
        refused(
            post_status(Api::GitHub, &json!({"state": "warning"})),
            422,
            "is not one of",
        );
        // Gitea's CommitStatusState lists four states; Forgejo's adds "warning".
        refused(
            post_status(Api::Gitea, &json!({"state": "warning"})),
            422,
            "the values its description lists",
        );
        assert!(post_status(Api::Forgejo, &json!({"state": "warning"})).is_ok());
        refused(
            post_status(Api::Forgejo, &json!({"state": "skipped"})),
            422,
            "lists",
        );
        refused(
            post_status(Api::Gitea, &json!({"state": 3})),
            422,
            "not of type",
        );
    }

    #[test]
    fn a_missing_required_key_is_refused() {
        refused(
            post_status(Api::GitHub, &json!({"context": "x"})),
            422,
            "`state` is required",
        );
        for api in [Api::GitHub, Api::Gitea, Api::Forgejo] {
            let path = format!("{}/repos/o/r/issues/3/comments", prefix(api));
            let result = Validator::new(api, TOKEN).check(
                &Method::POST,
                &path,
                "",
                &headers(api),
                br#"{"text": "no body key"}"#,
            );
            refused(result, 422, "`body` is required");
        }
    }

    #[test]
    fn an_unknown_path_a_wrong_method_and_a_non_integer_issue_are_refused() {
        let v = Validator::new(Api::Gitea, TOKEN);
        let h = headers(Api::Gitea);
        refused(
            v.check(&Method::POST, "/api/v1/repos/o/r/status/abc", "", &h, b"{}"),
            404,
            "no operation",
        );
        refused(
            v.check(&Method::POST, "/repos/o/r/statuses/abc", "", &h, b"{}"),
            404,
            "base path",
        );
        refused(
            v.check(
                &Method::DELETE,
                "/api/v1/repos/o/r/statuses/abc",
                "",
                &h,
                b"",
            ),
            405,
            "no DELETE",
        );
        refused(
            v.check(
                &Method::GET,
                "/api/v1/repos/o/r/issues/seven/comments",
                "",
                &h,
                b"",
            ),
            404,
            "not an integer",
        );
        // Gitea's statuses/{sha} has no GET in the cut (the list is `repoListStatuses`,
        // which ProxOps does not call, so it is not vendored).
        refused(
            v.check(&Method::GET, "/api/v1/repos/o/r/statuses/abc", "", &h, b""),
            405,
            "no GET",
        );
    }

    #[test]
    fn a_per_page_over_the_maximum_and_an_undeclared_query_key_are_refused() {
        let v = Validator::new(Api::GitHub, TOKEN);
        let h = headers(Api::GitHub);
        let path = "/repos/o/r/issues/2/comments";
        assert!(v.check(&Method::GET, path, "per_page=100", &h, b"").is_ok());
        refused(
            v.check(&Method::GET, path, "per_page=101", &h, b""),
            422,
            "over the maximum 100",
        );
        refused(
            v.check(&Method::GET, path, "page=two", &h, b""),
            422,
            "not an integer",
        );
        refused(
            v.check(&Method::GET, path, "limit=5", &h, b""),
            400,
            "not declared",
        );
        // Gitea's issueGetComments declares only `since` and `before`: no paging.
        let gitea = Validator::new(Api::Gitea, TOKEN);
        let path = "/api/v1/repos/o/r/issues/2/comments";
        refused(
            gitea.check(&Method::GET, path, "page=1", &headers(Api::Gitea), b""),
            400,
            "not declared",
        );
        refused(
            gitea.check(
                &Method::GET,
                path,
                "access_token=t0ken",
                &headers(Api::Gitea),
                b"",
            ),
            400,
            "security scheme AccessToken",
        );
    }

    #[test]
    fn the_authorization_header_must_follow_the_security_scheme() {
        let path = "/api/v1/repos/o/r/statuses/abc";
        let body = br#"{"state": "pending"}"#;
        for api in [Api::Gitea, Api::Forgejo] {
            let v = Validator::new(api, TOKEN);
            let mut h = headers(api);
            assert!(v.check(&Method::POST, path, "", &h, body).is_ok());
            h.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
            refused(
                v.check(&Method::POST, path, "", &h, body),
                401,
                "`token <token>`",
            );
            h.insert("authorization", "token wrong".parse().unwrap());
            let refusal = v.check(&Method::POST, path, "", &h, body).unwrap_err();
            assert!(
                !refusal.1.contains("wrong"),
                "a sent token is never echoed: {}",
                refusal.1
            );
            h.remove("authorization");
            refused(
                v.check(&Method::POST, path, "", &h, body),
                401,
                "no Authorization header",
            );
        }
        let github = Validator::new(Api::GitHub, TOKEN);
        let mut h = headers(Api::GitHub);
        let path = "/repos/o/r/statuses/abc";
        h.insert("authorization", format!("token {TOKEN}").parse().unwrap());
        assert!(github.check(&Method::POST, path, "", &h, body).is_ok());
        h.insert("authorization", format!("Basic {TOKEN}").parse().unwrap());
        refused(
            github.check(&Method::POST, path, "", &h, body),
            401,
            "`Bearer <token>`",
        );
    }

    #[test]
    fn a_body_that_is_not_json_or_not_sent_as_json_is_refused() {
        let v = Validator::new(Api::GitHub, TOKEN);
        let mut h = headers(Api::GitHub);
        let path = "/repos/o/r/statuses/abc";
        refused(
            v.check(&Method::POST, path, "", &h, b"state=success"),
            415,
            "not JSON",
        );
        h.insert("content-type", "text/plain".parse().unwrap());
        refused(
            v.check(&Method::POST, path, "", &h, br#"{"state":"success"}"#),
            415,
            "content-type",
        );
        refused(
            v.check(
                &Method::GET,
                "/repos/o/r/issues/2/comments",
                "",
                &headers(Api::GitHub),
                b"{}",
            ),
            400,
            "takes no body",
        );
    }

    #[test]
    fn stated_additional_properties_nullable_and_items_are_enforced() {
        let v = Validator::new(Api::GitHub, TOKEN);
        let closed = json!({"type": "object", "properties": {"a": {"type": "string", "nullable": true}}, "additionalProperties": false});
        assert!(v.validate(&closed, &json!({"a": null}), "body").is_ok());
        assert!(
            v.validate(&closed, &json!({"a": "x", "b": 1}), "body")
                .unwrap_err()
                .contains("`b`")
        );
        let typed = json!({"type": "object", "additionalProperties": {"type": "integer"}, "properties": {"l": {"type": "array", "items": {"type": "string"}}}});
        assert!(
            v.validate(&typed, &json!({"n": 1, "l": ["x"]}), "body")
                .is_ok()
        );
        assert!(
            v.validate(&typed, &json!({"n": "1"}), "body")
                .unwrap_err()
                .contains("body.n")
        );
        assert!(
            v.validate(&typed, &json!({"l": [1]}), "body")
                .unwrap_err()
                .contains("body.l[0]")
        );
    }

    #[test]
    fn references_to_components_and_definitions_resolve() {
        let github = Validator::new(Api::GitHub, TOKEN);
        let per_page = github.resolve(&json!({"$ref": "#/components/parameters/per_page"}));
        assert_eq!(per_page["name"], "per_page");
        assert_eq!(
            declared_maximum(&per_page, &per_page["schema"]),
            Some(100.0)
        );
        let gitea = Validator::new(Api::Gitea, TOKEN);
        let option = gitea.resolve(&json!({"$ref": "#/definitions/CreateStatusOption"}));
        let state = gitea.resolve(&option["properties"]["state"]);
        assert_eq!(
            prose_enum(&state).unwrap(),
            ["pending", "success", "error", "failure"]
        );
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
