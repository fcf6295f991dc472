//! The CEL subset's syntax: tokens and a recursive-descent parser with CEL's precedence
//! (`||` < `&&` < relations and `in` < `+ -` < unary `! -` < member access, index and call).

use super::value::{CelError, Value};

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Int(i64),
    Op(&'static str),
}

fn tokenize(src: &str) -> Result<Vec<Token>, CelError> {
    const OPS: [&str; 20] =
        ["&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "+", "-", "(", ")", "[", "]", ".", ",", "?", ":", "%"];
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' {
            let (s, next) = string_literal(&chars, i)?;
            out.push(Token::Str(s));
            i = next;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            out.push(Token::Int(text.parse().map_err(|_| CelError::Unsupported(format!("number {text}")))?));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let op =
                OPS.iter().find(|op| rest.starts_with(**op)).ok_or_else(|| CelError::Unsupported(format!("character {c:?}")))?;
            out.push(Token::Op(op));
            i += op.len();
        }
    }
    Ok(out)
}

/// A quoted string starting at `start`; returns it and the index after the closing quote.
fn string_literal(chars: &[char], start: usize) -> Result<(String, usize), CelError> {
    let quote = chars[start];
    let mut s = String::new();
    let mut i = start + 1;
    while let Some(&c) = chars.get(i) {
        match c {
            _ if c == quote => return Ok((s, i + 1)),
            '\\' => {
                let e = *chars.get(i + 1).ok_or_else(|| CelError::Unsupported("unterminated string".into()))?;
                let hex = |n: usize| -> Result<char, CelError> {
                    let digits: String = chars.get(i + 2..i + 2 + n).unwrap_or_default().iter().collect();
                    u32::from_str_radix(&digits, 16)
                        .ok()
                        .and_then(char::from_u32)
                        .ok_or_else(|| CelError::Unsupported(format!("escape \\{e}{digits}")))
                };
                let (ch, len) = match e {
                    'n' => ('\n', 2),
                    't' => ('\t', 2),
                    'r' => ('\r', 2),
                    '\\' | '"' | '\'' => (e, 2),
                    'u' => (hex(4)?, 6),
                    'U' => (hex(8)?, 10),
                    _ => return Err(CelError::Unsupported(format!("escape \\{e}"))),
                };
                s.push(ch);
                i += len;
            }
            _ => {
                s.push(c);
                i += 1;
            }
        }
    }
    Err(CelError::Unsupported("unterminated string".into()))
}

#[derive(Debug, Clone)]
pub(super) enum Expr {
    Lit(Value),
    Ident(String),
    List(Vec<Expr>),
    Not(Box<Expr>),
    Neg(Box<Expr>),
    Binary(&'static str, Box<Expr>, Box<Expr>),
    Field(Box<Expr>, String),
    Index(Box<Expr>, Box<Expr>),
    /// A call: receiver (for `x.f(...)`), function, arguments.
    Call(Option<Box<Expr>>, String, Vec<Expr>),
}

pub(super) struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    pub(super) fn new(src: &str) -> Result<Self, CelError> {
        Ok(Self { tokens: tokenize(src)?, pos: 0 })
    }

    pub(super) fn parse_all(mut self) -> Result<Expr, CelError> {
        let e = self.or()?;
        match self.tokens.get(self.pos) {
            None => Ok(e),
            Some(t) => Err(CelError::Unsupported(format!("unexpected {t:?}"))),
        }
    }

    fn peek_op(&self, op: &str) -> bool {
        matches!(self.tokens.get(self.pos), Some(Token::Op(o)) if *o == op)
    }

    fn eat(&mut self, op: &str) -> bool {
        let hit = self.peek_op(op);
        self.pos += usize::from(hit);
        hit
    }

    fn expect(&mut self, op: &str) -> Result<(), CelError> {
        if self.eat(op) { Ok(()) } else { Err(CelError::Unsupported(format!("expected {op:?}"))) }
    }

    fn or(&mut self) -> Result<Expr, CelError> {
        let mut e = self.and()?;
        while self.eat("||") {
            e = Expr::Binary("||", Box::new(e), Box::new(self.and()?));
        }
        if self.peek_op("?") {
            return Err(CelError::Unsupported("the conditional operator".into()));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, CelError> {
        let mut e = self.relation()?;
        while self.eat("&&") {
            e = Expr::Binary("&&", Box::new(e), Box::new(self.relation()?));
        }
        Ok(e)
    }

    fn relation(&mut self) -> Result<Expr, CelError> {
        let mut e = self.additive()?;
        loop {
            let op = match self.tokens.get(self.pos) {
                Some(Token::Op(op @ ("==" | "!=" | "<" | "<=" | ">" | ">="))) => *op,
                Some(Token::Ident(w)) if w == "in" => "in",
                _ => return Ok(e),
            };
            self.pos += 1;
            e = Expr::Binary(op, Box::new(e), Box::new(self.additive()?));
        }
    }

    fn additive(&mut self) -> Result<Expr, CelError> {
        let mut e = self.unary()?;
        loop {
            let op = if self.eat("+") {
                "+"
            } else if self.eat("-") {
                "-"
            } else {
                return Ok(e);
            };
            e = Expr::Binary(op, Box::new(e), Box::new(self.unary()?));
        }
    }

    fn unary(&mut self) -> Result<Expr, CelError> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("-") {
            return Ok(Expr::Neg(Box::new(self.unary()?)));
        }
        self.member()
    }

    fn member(&mut self) -> Result<Expr, CelError> {
        let mut e = self.primary()?;
        loop {
            if self.eat(".") {
                let Some(Token::Ident(name)) = self.tokens.get(self.pos).cloned() else {
                    return Err(CelError::Unsupported("a field name after '.'".into()));
                };
                self.pos += 1;
                e = if self.eat("(") {
                    Expr::Call(Some(Box::new(e)), name, self.args()?)
                } else {
                    Expr::Field(Box::new(e), name)
                };
            } else if self.eat("[") {
                let index = self.or()?;
                self.expect("]")?;
                e = Expr::Index(Box::new(e), Box::new(index));
            } else {
                return Ok(e);
            }
        }
    }

    /// Arguments after `(`, through `)`.
    fn args(&mut self) -> Result<Vec<Expr>, CelError> {
        let mut args = Vec::new();
        if self.eat(")") {
            return Ok(args);
        }
        loop {
            args.push(self.or()?);
            if self.eat(")") {
                return Ok(args);
            }
            self.expect(",")?;
        }
    }

    fn primary(&mut self) -> Result<Expr, CelError> {
        let token = self.tokens.get(self.pos).cloned().ok_or_else(|| CelError::Unsupported("unexpected end".into()))?;
        self.pos += 1;
        match token {
            Token::Str(s) => Ok(Expr::Lit(Value::Str(s))),
            Token::Int(i) => Ok(Expr::Lit(Value::Int(i))),
            Token::Ident(w) if w == "true" || w == "false" => Ok(Expr::Lit(Value::Bool(w == "true"))),
            Token::Ident(w) if self.eat("(") => Ok(Expr::Call(None, w, self.args()?)),
            Token::Ident(w) => Ok(Expr::Ident(w)),
            Token::Op("(") => {
                let e = self.or()?;
                self.expect(")")?;
                Ok(e)
            }
            Token::Op("[") => {
                let mut items = Vec::new();
                if !self.eat("]") {
                    loop {
                        items.push(self.or()?);
                        if self.eat("]") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                Ok(Expr::List(items))
            }
            t => Err(CelError::Unsupported(format!("unexpected {t:?}"))),
        }
    }
}
