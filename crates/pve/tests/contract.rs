//! Contract test: every request the builders can produce exists in PVE's API schema.
//!
//! For each request of `request::all_endpoints_for_contract()` (which calls every builder with
//! every optional parameter set) this checks, against `shared/pve-api/apidoc-full.json`: the
//! path template with that HTTP method, each parameter name (indexed names such as `scsi0`
//! match the schema's `scsi[n]`), enum and boolean/integer values, and that no parameter
//! repeats a path parameter. It is skipped, with the reason printed, when the schema file is
//! not there (a checkout without `../shared`).

use std::collections::BTreeMap;
use std::path::Path;

use proxops_pve::request::{Request, all_endpoints_for_contract};
use serde_json::Value;

const APIDOC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/pve-api/apidoc-full.json"
);

/// `(METHOD, path template)` → that method's `parameters.properties`.
fn index_schema(nodes: &[Value], out: &mut BTreeMap<(String, String), BTreeMap<String, Value>>) {
    for node in nodes {
        let path = node["path"].as_str().unwrap_or_default().to_owned();
        if let Some(info) = node["info"].as_object() {
            for (method, def) in info {
                let props = def["parameters"]["properties"]
                    .as_object()
                    .map(|m| m.clone().into_iter().collect())
                    .unwrap_or_default();
                out.insert((method.clone(), path.clone()), props);
            }
        }
        if let Some(children) = node["children"].as_array() {
            index_schema(children, out);
        }
    }
}

/// The schema property for `name`, trying `name` and then `prefix[n]` for `prefix<digits>`.
fn property<'a>(props: &'a BTreeMap<String, Value>, name: &str) -> Option<&'a Value> {
    props.get(name).or_else(|| {
        let prefix = name.trim_end_matches(|c: char| c.is_ascii_digit());
        (prefix.len() < name.len())
            .then(|| props.get(&format!("{prefix}[n]")))
            .flatten()
    })
}

fn check(req: &Request, props: &BTreeMap<String, Value>) -> Vec<String> {
    let mut problems = Vec::new();
    let path_params: Vec<&str> = req
        .template
        .split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect();
    for name in &path_params {
        if !props.contains_key(*name) {
            problems.push(format!("path parameter {name} is not in the schema"));
        }
    }
    for (name, value) in req.parameters() {
        if path_params.contains(&name) {
            problems.push(format!("{name} repeats a path parameter"));
            continue;
        }
        let Some(prop) = property(props, name) else {
            problems.push(format!("parameter {name} is not in the schema"));
            continue;
        };
        if let Some(values) = prop["enum"].as_array()
            && !values.iter().any(|v| v.as_str() == Some(value))
        {
            problems.push(format!("{name}={value} is not in the enum {values:?}"));
        }
        match prop["type"].as_str() {
            Some("boolean") if !matches!(value, "0" | "1") => {
                problems.push(format!("boolean {name}={value} is not 0/1"));
            }
            Some("integer") if value.parse::<i64>().is_err() => {
                problems.push(format!("integer {name}={value} does not parse"));
            }
            _ => {}
        }
    }
    problems
}

#[test]
fn every_built_request_exists_in_the_pve_api_schema() {
    if !Path::new(APIDOC).exists() {
        eprintln!("skipped: PVE API schema not found at {APIDOC} (../shared is absent)");
        return;
    }
    let text = std::fs::read_to_string(APIDOC).unwrap();
    let root: Value = serde_json::from_str(&text).unwrap();
    let mut schema = BTreeMap::new();
    index_schema(root.as_array().unwrap(), &mut schema);
    assert!(
        schema.len() > 500,
        "schema index looks wrong: {} entries",
        schema.len()
    );

    let requests = all_endpoints_for_contract();
    let mut failures = Vec::new();
    for req in &requests {
        let key = (req.method.as_str().to_owned(), req.template.to_owned());
        match schema.get(&key) {
            None => failures.push(format!("{} {}: no such endpoint", key.0, key.1)),
            Some(props) => {
                for p in check(req, props) {
                    failures.push(format!("{} {}: {p}", key.0, key.1));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "contract violations:\n{}",
        failures.join("\n")
    );
}

#[test]
fn contract_check_catches_unknown_endpoints_and_parameters() {
    if !Path::new(APIDOC).exists() {
        eprintln!("skipped: PVE API schema not found at {APIDOC} (../shared is absent)");
        return;
    }
    let root: Value = serde_json::from_str(&std::fs::read_to_string(APIDOC).unwrap()).unwrap();
    let mut schema = BTreeMap::new();
    index_schema(root.as_array().unwrap(), &mut schema);
    // The PVE 8-era download path and POST resize are known 501s (LIVE-FACTS.md §1.1).
    assert!(!schema.contains_key(&(
        "POST".into(),
        "/nodes/{node}/storage/{storage}/download".into()
    )));
    assert!(!schema.contains_key(&("POST".into(), "/nodes/{node}/qemu/{vmid}/resize".into())));
    assert!(!schema.contains_key(&("POST".into(), "/nodes/{node}/lxc/{vmid}/config".into())));
    // A wrong boolean spelling and an unknown key are reported.
    let mut req = proxops_pve::request::qemu_clone("pve1", 100, &Default::default());
    req.form.push(("full".into(), "true".into()));
    req.form.push(("start".into(), "1".into()));
    let props = &schema[&("POST".into(), "/nodes/{node}/qemu/{vmid}/clone".into())];
    let problems = check(&req, props);
    assert_eq!(problems.len(), 2, "{problems:?}");
}
