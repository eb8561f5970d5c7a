//! A JSON Schema of the manifest format, for editors (`proxops schema`).
//!
//! Derived with schemars from the same raw types the parser decodes (`manifest::raw`), so a
//! key the parser knows is in the schema and no other: every object says
//! `additionalProperties: false`, like the strict parser. Draft-07, the draft the YAML
//! language server supports best, with one `if kind matches … then spec: …` branch per kind
//! (kind spellings are matched case-insensitively, aliases included, as the parser does).
//!
//! The schema is an editor aid, not the validator: value rules such as "memory is a whole
//! number of MiB" or "two disks on one slot" are only checked by `proxops validate`.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use crate::manifest::API_VERSION;
use crate::manifest::raw::{RawArtifactSpec, RawLxcSpec, RawMetadata, RawVmSpec};
use crate::resource::Kind;

/// Every spelling of a kind the parser accepts (compared case-insensitively).
fn spellings(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Vm => &["vm"],
        Kind::Lxc => &["lxc"],
        Kind::Iso => &["iso"],
        Kind::CtTemplate => &["cttemplate", "ctt"],
        Kind::DiskImage => &["diskimage", "disk"],
        Kind::TemplateVm => &["templatevm", "tvm", "template"],
        Kind::TemplateCt => &["templatect", "tct"],
    }
}

/// A regular expression matching `words` in any letter case (JSON Schema has no `i` flag).
fn any_case(words: &[&str]) -> String {
    let alternatives: Vec<String> = words
        .iter()
        .map(|w| {
            w.chars()
                .map(|c| {
                    if c.is_ascii_alphabetic() {
                        format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase())
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        })
        .collect();
    format!("^({})$", alternatives.join("|"))
}

/// The JSON Schema (draft-07) of one manifest document.
pub fn manifest_json_schema() -> Value {
    let mut generator = SchemaSettings::draft07().into_generator();
    let metadata = generator.subschema_for::<RawMetadata>().to_value();
    let vm = generator.subschema_for::<RawVmSpec>().to_value();
    let lxc = generator.subschema_for::<RawLxcSpec>().to_value();
    let artifact = generator.subschema_for::<RawArtifactSpec>().to_value();
    let definitions = generator.take_definitions(true);

    let branches: Vec<Value> = Kind::ALL
        .iter()
        .map(|&kind| {
            let spec = match kind {
                Kind::Vm | Kind::TemplateVm => &vm,
                Kind::Lxc | Kind::TemplateCt => &lxc,
                _ => &artifact,
            };
            json!({
                "if": {
                    "properties": { "kind": { "pattern": any_case(spellings(kind)) } },
                    "required": ["kind"]
                },
                "then": { "properties": { "spec": spec } }
            })
        })
        .collect();
    let all_spellings: Vec<&str> = Kind::ALL
        .iter()
        .flat_map(|&k| spellings(k).iter().copied())
        .collect();

    let schema = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://proxops.invalid/schema/manifest-v1alpha1.json",
        "title": "ProxOps manifest",
        "description": "One ProxOps manifest document (apiVersion proxops/v1alpha1).",
        "type": "object",
        "additionalProperties": false,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": { "const": API_VERSION, "description": "Always proxops/v1alpha1." },
            "kind": {
                "type": "string",
                "description": "VM, LXC, ISO, CTTemplate, DiskImage, TemplateVM or TemplateCT (case-insensitive; aliases CTT, DISK, TVM, TEMPLATE, TCT).",
                "pattern": any_case(&all_spellings)
            },
            "metadata": metadata,
            "spec": { "type": "object" }
        },
        "allOf": branches,
        "definitions": Value::Object(definitions)
    });
    rename_definitions(schema)
}

/// Drops the `Raw` prefix of the Rust type names from definition names and references.
fn rename_definitions(schema: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get_mut("$ref")
                    && let Some(name) = reference.strip_prefix("#/definitions/Raw")
                {
                    *reference = format!("#/definitions/{name}");
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut schema = schema;
    if let Some(Value::Object(definitions)) = schema.get_mut("definitions") {
        let renamed: Map<String, Value> = std::mem::take(definitions)
            .into_iter()
            .map(|(name, def)| {
                (
                    name.strip_prefix("Raw").map_or(name.clone(), str::to_owned),
                    def,
                )
            })
            .collect();
        *definitions = renamed;
    }
    walk(&mut schema);
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::testing::{FULL_ISO, FULL_LXC, FULL_VM};
    use crate::manifest::yaml::{Node, Value as Yaml, parse_documents};

    /// Follows `$ref`s and the non-null branch of `anyOf` (how schemars writes `Option<T>`).
    fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let name = reference.trim_start_matches("#/definitions/");
            return resolve(root, &root["definitions"][name]);
        }
        if let Some(options) = schema.get("anyOf").and_then(Value::as_array)
            && let Some(non_null) = options
                .iter()
                .find(|o| o.get("type") != Some(&json!("null")))
        {
            return resolve(root, non_null);
        }
        schema
    }

    /// Asserts that every mapping key in `node` is a property of `schema`, recursively.
    fn assert_known(root: &Value, schema: &Value, node: &Node, path: &str) {
        let schema = resolve(root, schema);
        match &node.value {
            Yaml::Map(entries) => {
                for (key, value) in entries {
                    let key = key.as_str().unwrap();
                    let field = format!("{path}.{key}");
                    if let Some(property) = schema.get("properties").and_then(|p| p.get(key)) {
                        assert_known(root, property, value, &field);
                    } else {
                        let free_form = schema
                            .get("additionalProperties")
                            .is_some_and(Value::is_object);
                        assert!(free_form, "{field} is not in the schema: {schema:#}");
                    }
                }
            }
            Yaml::Seq(items) => {
                for (i, item) in items.iter().enumerate() {
                    assert_known(root, &schema["items"], item, &format!("{path}[{i}]"));
                }
            }
            _ => {}
        }
    }

    fn spec_schema<'a>(root: &'a Value, kind: &str) -> &'a Value {
        let branch = root["allOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| {
                let pattern = b["if"]["properties"]["kind"]["pattern"].as_str().unwrap();
                pattern.contains(
                    &any_case(&[kind])
                        .trim_start_matches("^(")
                        .trim_end_matches(")$")
                        .to_owned(),
                )
            })
            .unwrap();
        &branch["then"]["properties"]["spec"]
    }

    #[test]
    fn every_key_of_the_full_examples_is_in_the_schema() {
        let schema = manifest_json_schema();
        for (yaml, kind) in [(FULL_VM, "vm"), (FULL_LXC, "lxc"), (FULL_ISO, "iso")] {
            let docs = parse_documents("full.yaml", yaml);
            let root = docs[0].root.as_ref().unwrap();
            for (key, value) in match &root.value {
                Yaml::Map(entries) => entries,
                _ => panic!(),
            } {
                let key = key.as_str().unwrap();
                assert!(schema["properties"].get(key).is_some(), "{key}");
                let property = if key == "spec" {
                    spec_schema(&schema, kind)
                } else {
                    &schema["properties"][key]
                };
                assert_known(&schema, property, value, key);
            }
        }
    }

    #[test]
    fn every_object_in_the_schema_is_closed_like_the_parser() {
        let schema = manifest_json_schema();
        for (name, def) in schema["definitions"].as_object().unwrap() {
            if def.get("properties").is_some() {
                assert_eq!(def["additionalProperties"], json!(false), "{name}");
            }
        }
        assert_eq!(schema["additionalProperties"], json!(false));
    }

    #[test]
    fn required_fields_match_the_validator() {
        let schema = manifest_json_schema();
        let required = |name: &str| -> Vec<String> {
            let mut r: Vec<String> =
                serde_json::from_value(schema["definitions"][name]["required"].clone())
                    .unwrap_or_default();
            r.sort();
            r
        };
        assert_eq!(required("VmSpec"), ["cpu", "memory", "node", "vmid"]);
        assert_eq!(
            required("LxcSpec"),
            ["cpu", "memory", "node", "root", "template", "vmid"]
        );
        assert_eq!(required("ArtifactSpec"), ["filename", "storage", "url"]);
        assert_eq!(required("Disk"), ["storage"]);
    }

    #[test]
    fn kind_branches_match_every_spelling_in_any_case() {
        let schema = manifest_json_schema();
        let text = schema.to_string();
        assert!(text.contains("[tT][eE][mM][pP][lL][aA][tT][eE]"));
        assert!(
            !text.contains("#/definitions/Raw"),
            "definition names drop the Rust prefix"
        );
        assert_eq!(
            schema["$schema"],
            json!("http://json-schema.org/draft-07/schema#")
        );
        assert_eq!(schema["allOf"].as_array().unwrap().len(), 7);
    }
}
