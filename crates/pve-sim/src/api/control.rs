//! The `/_sim/...` control API (no authentication; JSON bodies): faults and the request
//! log, for tests written in other languages or against the binary. Documented in the
//! crate README.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::control::SimControl;
use crate::faults::HttpFault;
use crate::state::Shared;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StorageListing {
    node: String,
    storage: String,
    #[serde(default = "one")]
    times: u32,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Latency {
    #[serde(default)]
    pattern: Option<String>,
    millis: u64,
    #[serde(default)]
    probability: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultSeed {
    seed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskFailure {
    #[serde(rename = "type")]
    kind: String,
    message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LockTimeout {
    vmid: u32,
    #[serde(default = "one")]
    times: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HaMaintenance {
    node: String,
    enable: bool,
}

fn one() -> u32 {
    1
}

fn answer(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(body).unwrap_or_default(),
        )))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn bad(message: impl std::fmt::Display) -> Response<Full<Bytes>> {
    answer(
        StatusCode::BAD_REQUEST,
        &json!({ "error": message.to_string() }),
    )
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Box<Response<Full<Bytes>>>> {
    serde_json::from_slice(body).map_err(|e| Box::new(bad(format!("invalid JSON body: {e}"))))
}

/// Handles one `/_sim/...` request.
pub(crate) fn handle(
    shared: &Arc<Shared>,
    method: &str,
    path: &str,
    body: &[u8],
) -> Response<Full<Bytes>> {
    let control = SimControl::new(Arc::clone(shared));
    let ok = || answer(StatusCode::OK, &json!({ "ok": true }));
    let result =
        match (method, path.trim_end_matches('/')) {
            ("GET", "/_sim/requests") => Ok(answer(
                StatusCode::OK,
                &serde_json::to_value(control.requests()).unwrap_or(Value::Null),
            )),
            ("DELETE", "/_sim/requests") => {
                control.clear_requests();
                Ok(ok())
            }
            ("DELETE", "/_sim/faults") => {
                control.clear_faults();
                Ok(ok())
            }
            ("POST", "/_sim/faults/storage-listing") => parse::<StorageListing>(body).map(|f| {
                control.fail_storage_listing(&f.node, &f.storage, f.times, f.message.as_deref());
                ok()
            }),
            ("POST", "/_sim/faults/http") => parse::<HttpFault>(body)
                .map(|f| control.fail_requests(f).map_or_else(bad, |()| ok())),
            ("POST", "/_sim/faults/lost-answer") => parse::<HttpFault>(body)
                .map(|f| control.lose_answers(f).map_or_else(bad, |()| ok())),
            ("POST", "/_sim/faults/latency") => parse::<Latency>(body).map(|f| {
                let delay = Duration::from_millis(f.millis);
                match f.probability {
                    None => control.add_latency(f.pattern.as_deref(), delay),
                    Some(p) => control.add_latency_spikes(f.pattern.as_deref(), delay, p),
                }
                .map_or_else(bad, |()| ok())
            }),
            ("POST", "/_sim/faults/seed") => parse::<FaultSeed>(body).map(|f| {
                control.seed_faults(f.seed);
                ok()
            }),
            ("POST", "/_sim/faults/task") => parse::<TaskFailure>(body).map(|f| {
                control.fail_next_task(&f.kind, &f.message);
                ok()
            }),
            ("POST", "/_sim/faults/lock-timeout") => parse::<LockTimeout>(body).map(|f| {
                control.time_out_lock(f.vmid, f.times);
                ok()
            }),
            ("POST", "/_sim/ha/maintenance") => parse::<HaMaintenance>(body).map(|m| {
                if control.set_ha_maintenance(&m.node, m.enable) {
                    ok()
                } else {
                    bad(format!("no node {}", m.node))
                }
            }),
            _ => Ok(answer(
                StatusCode::NOT_FOUND,
                &json!({ "error": format!("no control endpoint {method} {path}") }),
            )),
        };
    result.unwrap_or_else(|r| *r)
}
