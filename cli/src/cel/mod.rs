//! A small evaluator for the CEL device selectors this project writes: the chart's DeviceClass
//! (`device.driver == "..." && device.attributes["..."].type == "hami-gpu"`), the webhook's model
//! and UUID selectors (`has(...)`, `[...].exists(t, ... .lowerAscii().contains(t))`, `in [...]`)
//! and the documented capacity and version comparisons (`compareTo(quantity("8Gi"))`,
//! `compareTo(semver("8.0.0"))`). Anything outside that subset is [`CelError::Unsupported`], so a
//! caller says "not evaluated" instead of guessing what the scheduler's full CEL would answer.

use std::cmp::Ordering;
use vgpu_scheduling::Quantity;

mod parse;
mod value;

use parse::{Expr, Parser};
pub use value::{CelError, Value};

/// Evaluates `expr` with `device` bound to the variable `device`; the result must be a bool.
///
/// # Errors
/// [`CelError::Unsupported`] for syntax or functions outside the subset, [`CelError::Runtime`]
/// for a missing attribute or a type mismatch on this device.
pub fn eval_selector(expr: &str, device: &Value) -> Result<bool, CelError> {
    let ast = Parser::new(expr)?.parse_all()?;
    // Unsupported functions are found before evaluation, so that a runtime error elsewhere in
    // the expression never hides that the whole of it could not have been evaluated.
    supported(&ast)?;
    let mut scope = vec![("device".to_owned(), device.clone())];
    match eval(&ast, &mut scope)? {
        Value::Bool(b) => Ok(b),
        other => Err(CelError::Runtime(format!("the selector gives a {}, not a bool", other.type_name()))),
    }
}

/// The functions and macros [`call`] and [`eval`] implement.
const FUNCTIONS: [&str; 14] = [
    "has",
    "exists",
    "all",
    "quantity",
    "semver",
    "lowerAscii",
    "upperAscii",
    "contains",
    "startsWith",
    "endsWith",
    "size",
    "compareTo",
    "isGreaterThan",
    "isLessThan",
];

fn supported(e: &Expr) -> Result<(), CelError> {
    match e {
        Expr::Lit(_) | Expr::Ident(_) => Ok(()),
        Expr::List(items) => items.iter().try_for_each(supported),
        Expr::Not(x) | Expr::Neg(x) | Expr::Field(x, _) => supported(x),
        Expr::Binary(_, l, r) | Expr::Index(l, r) => supported(l).and_then(|()| supported(r)),
        Expr::Call(target, name, args) => {
            if !FUNCTIONS.contains(&name.as_str()) {
                return Err(CelError::Unsupported(format!("function {name}")));
            }
            target.iter().try_for_each(|t| supported(t))?;
            args.iter().try_for_each(supported)
        }
    }
}

type Scope = Vec<(String, Value)>;

fn runtime(msg: impl Into<String>) -> CelError {
    CelError::Runtime(msg.into())
}

fn eval(e: &Expr, scope: &mut Scope) -> Result<Value, CelError> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Ident(name) => scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| CelError::Unsupported(format!("identifier {name}"))),
        Expr::List(items) => items.iter().map(|i| eval(i, scope)).collect::<Result<_, _>>().map(Value::List),
        Expr::Not(inner) => match eval(inner, scope)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            v => Err(runtime(format!("! applied to a {}", v.type_name()))),
        },
        Expr::Neg(inner) => match eval(inner, scope)? {
            Value::Int(i) => Ok(Value::Int(-i)),
            v => Err(runtime(format!("- applied to a {}", v.type_name()))),
        },
        Expr::Binary(op, l, r) => binary(op, l, r, scope),
        Expr::Field(target, name) => select(&eval(target, scope)?, name),
        Expr::Index(target, index) => match eval(index, scope)? {
            Value::Str(key) => select(&eval(target, scope)?, &key),
            v => Err(CelError::Unsupported(format!("an index of type {}", v.type_name()))),
        },
        Expr::Call(None, name, args) if name == "has" => has(args, scope),
        Expr::Call(Some(target), name, args) if name == "exists" || name == "all" => macro_over_list(target, name, args, scope),
        Expr::Call(target, name, args) => {
            let this = target.as_ref().map(|t| eval(t, scope)).transpose()?;
            let args: Vec<Value> = args.iter().map(|a| eval(a, scope)).collect::<Result<_, _>>()?;
            call(this, name, &args)
        }
    }
}

fn select(target: &Value, key: &str) -> Result<Value, CelError> {
    match target {
        Value::Map(m) => m.get(key).cloned().ok_or_else(|| runtime(format!("no such key: {key}"))),
        v => Err(runtime(format!("field {key} of a {}", v.type_name()))),
    }
}

/// `has(a.b)`: whether map `a` has key `b` (the one form of the macro).
fn has(args: &[Expr], scope: &mut Scope) -> Result<Value, CelError> {
    match args {
        [Expr::Field(target, key)] => match eval(target, scope)? {
            Value::Map(m) => Ok(Value::Bool(m.contains_key(key))),
            v => Err(runtime(format!("has() on a {}", v.type_name()))),
        },
        _ => Err(CelError::Unsupported("has() of anything but a field".into())),
    }
}

fn macro_over_list(target: &Expr, name: &str, args: &[Expr], scope: &mut Scope) -> Result<Value, CelError> {
    let [Expr::Ident(var), body] = args else {
        return Err(CelError::Unsupported(format!("{name}() without a variable and a predicate")));
    };
    let Value::List(items) = eval(target, scope)? else {
        return Err(CelError::Unsupported(format!("{name}() over anything but a list")));
    };
    let want = name == "exists";
    for item in items {
        scope.push((var.clone(), item));
        let got = eval(body, scope);
        scope.pop();
        match got? {
            Value::Bool(b) if b == want => return Ok(Value::Bool(want)),
            Value::Bool(_) => {}
            v => return Err(runtime(format!("{name}() predicate gives a {}", v.type_name()))),
        }
    }
    Ok(Value::Bool(!want))
}

fn binary(op: &str, l: &Expr, r: &Expr, scope: &mut Scope) -> Result<Value, CelError> {
    let as_bool = |v: Result<Value, CelError>| match v? {
        Value::Bool(b) => Ok(b),
        v => Err(runtime(format!("{op} on a {}", v.type_name()))),
    };
    match op {
        // CEL's logic is commutative over errors: `false && error` is false whichever side
        // fails, so an error only wins when the other side does not decide.
        "&&" | "||" => {
            let decisive = op == "||";
            let (a, b) = (as_bool(eval(l, scope)), as_bool(eval(r, scope)));
            match (a, b) {
                (Ok(x), _) if x == decisive => Ok(Value::Bool(decisive)),
                (_, Ok(y)) if y == decisive => Ok(Value::Bool(decisive)),
                (Ok(_), Ok(_)) => Ok(Value::Bool(!decisive)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        }
        _ => {
            let (a, b) = (eval(l, scope)?, eval(r, scope)?);
            match (op, &a, &b) {
                ("==", ..) => Ok(Value::Bool(equal(&a, &b)?)),
                ("!=", ..) => Ok(Value::Bool(!equal(&a, &b)?)),
                ("in", _, Value::List(items)) => Ok(Value::Bool(items.iter().any(|i| equal(&a, i).unwrap_or(false)))),
                ("+", Value::Str(x), Value::Str(y)) => Ok(Value::Str(format!("{x}{y}"))),
                ("+", Value::Int(x), Value::Int(y)) => x.checked_add(*y).map(Value::Int).ok_or_else(|| runtime("overflow")),
                ("-", Value::Int(x), Value::Int(y)) => x.checked_sub(*y).map(Value::Int).ok_or_else(|| runtime("overflow")),
                ("<" | "<=" | ">" | ">=", Value::Int(x), Value::Int(y)) => Ok(Value::Bool(ordered(op, x.cmp(y)))),
                ("<" | "<=" | ">" | ">=", Value::Str(x), Value::Str(y)) => Ok(Value::Bool(ordered(op, x.cmp(y)))),
                _ => Err(runtime(format!("{op} on a {} and a {}", a.type_name(), b.type_name()))),
            }
        }
    }
}

fn ordered(op: &str, o: Ordering) -> bool {
    match op {
        "<" => o.is_lt(),
        "<=" => o.is_le(),
        ">" => o.is_gt(),
        _ => o.is_ge(),
    }
}

/// CEL's `==`: values of different types are an error (no implicit conversion), as in the
/// scheduler's CEL.
fn equal(a: &Value, b: &Value) -> Result<bool, CelError> {
    if std::mem::discriminant(a) != std::mem::discriminant(b) {
        return Err(runtime(format!("no such overload: {} == {}", a.type_name(), b.type_name())));
    }
    Ok(a == b)
}

fn call(this: Option<Value>, name: &str, args: &[Value]) -> Result<Value, CelError> {
    let unsupported = || CelError::Unsupported(format!("function {name}"));
    match (this, name, args) {
        (None, "quantity", [Value::Str(s)]) => Quantity::parse(s).map(Value::Quantity).map_err(|e| runtime(e.to_string())),
        (None, "semver", [Value::Str(s)]) => Value::version(s).ok_or_else(|| runtime(format!("invalid semver {s:?}"))),
        (Some(Value::Str(s)), "lowerAscii", []) => Ok(Value::Str(s.to_ascii_lowercase())),
        (Some(Value::Str(s)), "upperAscii", []) => Ok(Value::Str(s.to_ascii_uppercase())),
        (Some(Value::Str(s)), "contains", [Value::Str(t)]) => Ok(Value::Bool(s.contains(t.as_str()))),
        (Some(Value::Str(s)), "startsWith", [Value::Str(t)]) => Ok(Value::Bool(s.starts_with(t.as_str()))),
        (Some(Value::Str(s)), "endsWith", [Value::Str(t)]) => Ok(Value::Bool(s.ends_with(t.as_str()))),
        (Some(Value::List(l)), "size", []) => Ok(Value::Int(i64::try_from(l.len()).unwrap_or(i64::MAX))),
        (None, "size", [Value::List(l)]) => Ok(Value::Int(i64::try_from(l.len()).unwrap_or(i64::MAX))),
        (Some(a), "compareTo" | "isGreaterThan" | "isLessThan", [b]) => {
            let o = match (&a, b) {
                (Value::Quantity(x), Value::Quantity(y)) => x.cmp(y),
                (Value::Version(..), Value::Version(..)) => version_key(&a).cmp(&version_key(b)),
                _ => return Err(runtime(format!("{name} on a {} and a {}", a.type_name(), b.type_name()))),
            };
            Ok(match name {
                "compareTo" => Value::Int(o as i64),
                "isGreaterThan" => Value::Bool(o.is_gt()),
                _ => Value::Bool(o.is_lt()),
            })
        }
        _ => Err(unsupported()),
    }
}

fn version_key(v: &Value) -> (u64, u64, u64) {
    match v {
        Value::Version(a, b, c) => (*a, *b, *c),
        _ => (0, 0, 0),
    }
}

#[cfg(test)]
mod tests;
