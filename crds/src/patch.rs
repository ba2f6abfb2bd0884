//! JSON merge patches (RFC 7386) computed from two versions of an object, for status writes.
//! The API types leave out empty and unset fields when they serialise, and a merge patch keeps
//! every member it does not name: a patch of the new status alone would never clear a list
//! that became empty or a field that became unset. The difference names them as `null`.

use serde_json::{Map, Value};

/// The merge patch that turns `from` into `to`: members of `to` that differ (objects compared
/// member by member, anything else replaced whole), and members of `from` that `to` lacks as
/// `null`. An empty object when they are equal.
pub fn merge_patch(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, value) in new {
                match old.get(key) {
                    Some(before) if before == value => {}
                    Some(before @ Value::Object(_)) if value.is_object() => {
                        patch.insert(key.clone(), merge_patch(before, value));
                    }
                    _ => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// The merge patch of an object's `status` from `from` (what exists, `None` when unset) to `to`.
pub fn status_patch<S: serde::Serialize>(from: Option<&S>, to: &S) -> Value {
    let value = |s: &S| serde_json::to_value(s).unwrap_or_else(|_| Value::Object(Map::new()));
    let old = from.map_or_else(|| Value::Object(Map::new()), value);
    serde_json::json!({ "status": merge_patch(&old, &value(to)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn removed_members_become_null_and_objects_are_diffed() {
        let from = json!({
            "placements": [{"agent": "a"}],
            "observed": {"latencyMillis": 40.0, "sloAttainment": 1.0},
            "scaler": {"withinSlo": 2, "violatedAt": 8},
            "phase": "Serving",
        });
        let to = json!({
            "observed": {"latencyMillis": 41.0, "sloAttainment": 1.0},
            "scaler": {"withinSlo": 2},
            "phase": "Pending",
        });
        assert_eq!(
            merge_patch(&from, &to),
            json!({
                "placements": null,
                "observed": {"latencyMillis": 41.0},
                "scaler": {"violatedAt": null},
                "phase": "Pending",
            })
        );
        assert_eq!(merge_patch(&to, &to), json!({}));
        // Lists are replaced whole.
        assert_eq!(
            merge_patch(&json!({"l": [1, 2]}), &json!({"l": [2]})),
            json!({"l": [2]})
        );
    }

    /// Applying the patch as RFC 7386 does gives `to` back.
    #[test]
    fn the_patch_applied_to_from_gives_to() {
        fn apply(target: &mut Value, patch: &Value) {
            let Value::Object(p) = patch else {
                *target = patch.clone();
                return;
            };
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    apply(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        let from = json!({"a": {"b": 1, "c": [1]}, "d": "x", "e": {"f": {"g": 1}}});
        let to = json!({"a": {"c": [2], "h": true}, "e": {"f": {}}, "i": 3});
        let mut target = from.clone();
        apply(&mut target, &merge_patch(&from, &to));
        assert_eq!(target, to);
    }
}
