//! The worker protocol's JSON schema, generated from the message types
//! (`schemas/worker-protocol.schema.json`; `tunelab schema
//! --worker-protocol`, `just schemas`). Each message has a definition named
//! by its worker, op and direction: `python.check.request`,
//! `native.check.answer`; a failed answer of any op is `failure`.

use schemars::gen::{SchemaGenerator, SchemaSettings};
use schemars::schema::Schema;
use schemars::JsonSchema;
use serde_json::{json, Value as Json};

use super::envelope::FailureKind;
use super::lines::Met;

/// One op a worker serves: its name and its messages' schemas.
pub struct Op {
    pub name: &'static str,
    request: fn(&mut SchemaGenerator) -> Schema,
    answer: fn(&mut SchemaGenerator) -> Schema,
}

fn schema_of<T: JsonSchema>(gen: &mut SchemaGenerator) -> Schema {
    gen.subschema_for::<T>()
}

impl Op {
    /// The op `name`, whose request body is `Q` and whose ok answer's is `A`.
    pub fn of<Q: JsonSchema, A: JsonSchema>(name: &'static str) -> Op {
        Op {
            name,
            request: schema_of::<Q>,
            answer: schema_of::<A>,
        }
    }
}

/// The definition a message of `worker`'s `op` has in the document
/// (`direction`: "request" or "answer").
pub fn definition(worker: &str, op: &str, direction: &str) -> String {
    format!("{worker}.{op}.{direction}")
}

/// The fields every request line has besides its body's.
fn request_envelope() -> Json {
    json!({
        "type": "object",
        "required": ["id", "op"],
        "properties": {
            "id": {"type": "integer"},
            "op": {"type": "string"},
        },
    })
}

/// The fields every answer line has besides its body's: the request's id,
/// when and how the worker met it, its own time (the last field).
fn answer_envelope(ok: bool, met: &Json) -> Json {
    let id = if ok {
        json!({"type": "integer"})
    } else {
        // A line with no integer id is answered with a null one.
        json!({"type": ["integer", "null"]})
    };
    json!({
        "type": "object",
        "required": ["id", "ok", "at_ns", "met", "worker_us"],
        "properties": {
            "id": id,
            "ok": {"const": ok},
            "idle_us": {"type": "number", "minimum": 0},
            "at_ns": {"type": "integer", "minimum": 0},
            "met": met,
            "worker_us": {"type": "number", "minimum": 0},
        },
    })
}

/// The whole document, as `schemas/worker-protocol.schema.json` holds it.
pub fn json_schema() -> String {
    let mut gen = SchemaSettings::draft07().into_generator();
    let met = serde_json::to_value(gen.subschema_for::<Met>()).expect("schema");
    let kind = serde_json::to_value(gen.subschema_for::<FailureKind>()).expect("schema");
    let mut named = serde_json::Map::new();
    for (worker, ops) in [
        ("python", super::python::ops()),
        ("native", super::native::ops()),
    ] {
        for op in ops {
            let request = serde_json::to_value((op.request)(&mut gen)).expect("schema");
            let answer = serde_json::to_value((op.answer)(&mut gen)).expect("schema");
            named.insert(
                definition(worker, op.name, "request"),
                json!({"allOf": [
                    request_envelope(),
                    {"properties": {"op": {"const": op.name}}},
                    request,
                ]}),
            );
            named.insert(
                definition(worker, op.name, "answer"),
                json!({"allOf": [answer_envelope(true, &met), answer]}),
            );
        }
    }
    let mut failure = answer_envelope(false, &met);
    failure["required"] = json!(["id", "ok", "class", "message", "at_ns", "met", "worker_us"]);
    failure["properties"]["class"] = kind;
    failure["properties"]["message"] = json!({"type": "string"});
    named.insert("failure".into(), failure);
    let mut definitions = serde_json::Map::new();
    for (name, schema) in gen.take_definitions() {
        let schema: Schema = schema;
        definitions.insert(name, serde_json::to_value(schema).expect("schema"));
    }
    definitions.extend(named);
    let mut doc = json!({});
    doc["$schema"] = json!("http://json-schema.org/draft-07/schema#");
    doc["title"] = json!("tunelab worker protocol");
    doc["description"] = json!(format!(
        "The JSON lines tunelab's runner and its workers exchange (docs/worker-protocol.md, \
         Python worker protocol {}; docs/native-backend.md, native worker protocol {}). \
         Generated from the Rust types in src/protocol/ (`just schemas`). Each message is a \
         definition named WORKER.OP.request or WORKER.OP.answer (an ok answer); a failed \
         answer of any op is `failure`.",
        super::python::VERSION,
        super::native::VERSION
    ));
    doc["definitions"] = Json::Object(definitions);
    serde_json::to_string_pretty(&doc).expect("schema serialises") + "\n"
}
