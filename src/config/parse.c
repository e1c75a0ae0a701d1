// The gin parser: a hand-written lexer and recursive-descent parser.
//
//   file       := (statement? NEWLINE)*
//   statement  := 'include' STRING | 'import' dotted | key '=' value
//   key        := NAME (('.' | '/') NAME)*      (scope/Name.param, or MACRO)
//   value      := ['-' | '+'] NUMBER | STRING+ | True | False | None
//               | '@' ref ['(' ')'] | '%' ref
//               | '[' [value (',' value)* [',']] ']'
//               | '(' ')' | '(' value ')' | '(' value ',' [value (',' value)* [',']] ')'
//               | '{' [value ':' value (',' value ':' value)* [',']] '}'
//   ref        := NAME (('.' | '/') NAME)*
//
// NUMBER and STRING are Python 3's literals, as gin reads them (lex_number,
// lex_string): 0x1F 0o17 0b101 1_000 1e-3 .5; 'a\101' r'\d' u'x' 'a' "b".
//
// Newlines end statements except inside brackets; a backslash at the end of
// a line continues it. The lexer never reads past len: text need not end in
// a NUL, and a NUL byte is an error.
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"
#include "core/fs.h"
#include "ctrax/core/memory.h"

#define MAX_NESTING 64        // brackets inside brackets in one value
#define MAX_INCLUDE_DEPTH 32  // files including files
#define MAX_FILE_BYTES (64u << 20)

typedef enum tok_kind {
    T_EOF = 0,
    T_NEWLINE,
    T_NAME,
    T_INT,    // u: the magnitude (a sign is a separate token)
    T_FLOAT,  // f
    T_STRING, // s (owned by the token)
    T_PUNCT,  // c: one of = , : ( ) [ ] { } @ % / . - +
} tok_kind;

typedef struct token {
    tok_kind kind;
    int line, col;
    const char *start;  // NAME: the text
    size_t len;
    uint64_t u;
    double f;
    char *s;
    size_t s_len;
    char c;
} token;

typedef struct parser {
    ct_config *cfg;
    const char *source;  // interned
    const char *dir;     // for relative includes; "" for the working directory
    const char *text;
    size_t len, pos;
    int line;
    size_t line_start;
    int depth;  // open brackets
    long nodes;  // items in the value being parsed, nested ones counted
    int value_line, value_col;  // where it starts
    token tok;
    bool override;
    ct_error *err;
} parser;

static int col_of(const parser *p, size_t pos) { return (int)(pos - p->line_start) + 1; }

static ct_status fail_at(parser *p, int line, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static ct_status fail_at(parser *p, int line, int col, const char *fmt, ...) {
    char msg[CT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_error_set(p->err, CT_ERR_FORMAT, "%s:%d:%d: %s", p->source, line, col, msg);
}

// ---- Lexer ----------------------------------------------------------------------------

static bool is_name_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(int c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_hex(int c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static int peek_at(const parser *p, size_t pos) { return pos < p->len ? (unsigned char)p->text[pos] : -1; }

static void newline(parser *p) {
    p->line++;
    p->line_start = p->pos;
}

static void tok_clear(token *t) {
    ct_free(t->s);
    memset(t, 0, sizeof *t);
}

// A character outside strings that cannot start a token.
static ct_status bad_char(parser *p, int c) {
    int col = col_of(p, p->pos);
    if (c == 0) return fail_at(p, p->line, col, "unexpected NUL byte");
    if (c < 0x20 || c >= 0x7f) return fail_at(p, p->line, col, "unexpected byte 0x%02x", c);
    return fail_at(p, p->line, col, "unexpected character '%c'", c);
}

static bool is_digit_in(int c, int base) {
    switch (base) {
    case 2: return c == '0' || c == '1';
    case 8: return c >= '0' && c <= '7';
    case 16: return is_hex(c);
    default: return is_digit(c);
    }
}

// Past digit (['_'] digit)* in base from s[i] (i itself if s[i] is no
// digit): Python's digit groups, an '_' only between two digits.
static size_t skip_digits(const char *s, size_t n, size_t i, int base) {
    if (i >= n || !is_digit_in((unsigned char)s[i], base)) return i;
    i++;
    while (i < n) {
        if (is_digit_in((unsigned char)s[i], base)) i++;
        else if (s[i] == '_' && i + 1 < n && is_digit_in((unsigned char)s[i + 1], base)) i += 2;
        else break;
    }
    return i;
}

#define UNDERSCORE_RULE "'_' may only stand between two digits (1_000)"

// Whether s[0..n) is a number in Python 3's grammar, which gin reads: NULL if
// so, with *base (2, 8, 10, 16) and *is_float set; else why not ("" when
// "invalid number" says it all). Accepted: 0x1F 0o17 0b101 0x_1F 1_000 0 00
// 1.5 1. .5 1_0.5 017.5 1e-3 1E+1_0. Refused: 017 (Python 3's SyntaxError,
// not octal and not 17), 1__0, 1_, 1_.5, 0o8, 0x.
static const char *number_syntax(const char *s, size_t n, int *base, bool *is_float) {
    *base = 10;
    *is_float = false;
    int c1 = n >= 2 && s[0] == '0' ? s[1] | 0x20 : 0;  // lower case
    if (c1 == 'x' || c1 == 'o' || c1 == 'b') {
        *base = c1 == 'x' ? 16 : c1 == 'o' ? 8 : 2;
        size_t i = 2 + (n > 2 && s[2] == '_');
        size_t e = skip_digits(s, n, i, *base);
        if (e == n && e > i) return NULL;
        if (e == n) return "no digits after the prefix";
        if (*base == 8 && is_digit(s[e])) return "an octal number takes the digits 0-7";
        if (*base == 2 && is_digit(s[e])) return "a binary number takes the digits 0 and 1";
        return s[e] == '_' || s[e - 1] == '_' ? UNDERSCORE_RULE : "";
    }
    size_t i = skip_digits(s, n, 0, 10);
    size_t int_end = i;
    if (i < n && s[i] == '.') {
        *is_float = true;
        i = skip_digits(s, n, i + 1, 10);
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        *is_float = true;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t e = skip_digits(s, n, i, 10);
        if (e == i) return i < n && s[i] == '_' ? UNDERSCORE_RULE : "expected digits after the exponent";
        i = e;
    }
    if (i < n) return s[i] == '_' || (i > 0 && s[i - 1] == '_') ? UNDERSCORE_RULE : "";
    if (!*is_float && s[0] == '0')
        for (size_t k = 0; k < int_end; k++)
            if (s[k] != '0' && s[k] != '_')
                return "a decimal integer cannot start with 0 (Python 3 refuses it: write 17, or 0o17 for octal)";
    return NULL;
}

static ct_status lex_number(parser *p, token *t) {
    size_t b = p->pos, e = b;
    int c1 = peek_at(p, b + 1) | 0x20;
    bool prefixed = peek_at(p, b) == '0' && (c1 == 'x' || c1 == 'o' || c1 == 'b');
    // The whole word, so that 12abc is one invalid number; a sign after a
    // decimal's e is the exponent's (1e-3).
    for (;;) {
        int c = peek_at(p, e);
        if (is_name_char(c) || c == '.') e++;
        else if ((c == '+' || c == '-') && !prefixed && (p->text[e - 1] | 0x20) == 'e') e++;
        else break;
    }
    const char *s = p->text + b;
    size_t n = e - b;
    int shown = n > 40 ? 40 : (int)n;
    int base;
    bool is_float;
    const char *why = number_syntax(s, n, &base, &is_float);
    if (why) return fail_at(p, p->line, col_of(p, b), "invalid number '%.*s'%s%s", shown, s, *why ? ": " : "", why);
    char digits[128];
    size_t nd = 0;
    for (size_t i = base == 10 ? 0 : 2; i < n; i++) {
        if (s[i] == '_') continue;
        if (nd + 1 >= sizeof digits) return fail_at(p, p->line, col_of(p, b), "number too long");
        digits[nd++] = s[i];
    }
    digits[nd] = '\0';
    errno = 0;
    if (is_float) {
        t->kind = T_FLOAT;
        t->f = strtod(digits, NULL);
        if (errno == ERANGE && isinf(t->f))
            return fail_at(p, p->line, col_of(p, b), "float %.*s is out of range", shown, s);
    } else {
        t->kind = T_INT;
        t->u = strtoull(digits, NULL, base);
        if (errno == ERANGE || t->u > (uint64_t)INT64_MAX + 1)
            return fail_at(p, p->line, col_of(p, b), "integer %.*s does not fit in 64 bits", shown, s);
    }
    p->pos = e;
    return CT_OK;
}

// Appends code point cp (at most 0x10FFFF, not a surrogate) as UTF-8.
static void put_utf8(cfg_buf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    cfg_buf_put(b, u, n);
}

// The escape whose backslash is at i (not a line end), as Python reads it in
// a string literal: appended to b, *end set past it. An escape Python does
// not know keeps its backslash ('\q' is \q), as in Python.
static ct_status lex_escape(parser *p, size_t i, cfg_buf *b, size_t *end) {
    int d = peek_at(p, i + 1);
    int col = col_of(p, i);
    static const char simple[] = "abfnrtv\\'\"", simple_means[] = "\a\b\f\n\r\t\v\\'\"";
    const char *at = d > 0 ? strchr(simple, d) : NULL;
    if (at) {
        cfg_buf_put(b, &simple_means[at - simple], 1);
        *end = i + 2;
        return CT_OK;
    }
    uint32_t cp = 0;
    size_t e = i + 2;
    if (d >= '0' && d <= '7') {  // \o, \oo, \ooo: octal, up to \777
        e = i + 1;
        while (e < i + 4 && peek_at(p, e) >= '0' && peek_at(p, e) <= '7') cp = cp * 8 + (uint32_t)(p->text[e++] - '0');
    } else if (d == 'x' || d == 'u' || d == 'U') {
        size_t want = d == 'x' ? 2 : d == 'u' ? 4 : 8;
        for (size_t k = 0; k < want; k++, e++) {
            int h = peek_at(p, e);
            if (!is_hex(h))
                return fail_at(p, p->line, col, "invalid escape '%.*s': \\%c takes exactly %zu hex digits",
                               (int)(e - i), p->text + i, d, want);
            cp = cp * 16 + (uint32_t)(is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
    } else if (d == 'N') {
        return fail_at(p, p->line, col, "the escape \\N{...} (a character by its Unicode name) is not supported: "
                                        "write the character itself or \\u with its code point");
    } else {
        cfg_buf_put(b, "\\", 1);
        *end = i + 1;  // the character after the backslash is read as any other
        return CT_OK;
    }
    int n = (int)(e - i);
    if (cp == 0)
        return fail_at(p, p->line, col, "invalid escape '%.*s': a NUL character is not allowed in a string", n,
                       p->text + i);
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return fail_at(p, p->line, col, "invalid escape '%.*s': U+%04X is a surrogate, which UTF-8 cannot encode", n,
                       p->text + i, (unsigned)cp);
    if (cp > 0x10FFFF)
        return fail_at(p, p->line, col, "invalid escape '%.*s': U+%X is past the last Unicode code point U+10FFFF", n,
                       p->text + i, (unsigned)cp);
    put_utf8(b, cp);
    *end = e;
    return CT_OK;
}

// A string literal from its opening quote at p->pos, as Python reads it
// (gin reads values with Python's literal syntax): escapes as lex_escape
// says, a backslash before a line end joins the next line; raw (r'...')
// keeps every backslash, one before a quote or a line end too.
static ct_status lex_string(parser *p, token *t, bool raw) {
    char q = p->text[p->pos];
    int line = p->line, col = col_of(p, p->pos);
    size_t i = p->pos + 1;
    cfg_buf b = {0};
    cfg_buf_put(&b, "", 0);
    ct_status st = CT_OK;
    for (;;) {
        int c = peek_at(p, i);
        if (c < 0 || c == '\n') {
            st = fail_at(p, line, col, "unterminated string (expected a closing %c on %s)", q,
                         line == p->line ? "this line" : "its last line");
            break;
        }
        if (c == 0) {
            st = fail_at(p, p->line, col_of(p, i), "unexpected NUL byte in a string");
            break;
        }
        if (c == q) break;
        if (c != '\\') {
            cfg_buf_put(&b, p->text + i, 1);
            i++;
            continue;
        }
        int d = peek_at(p, i + 1);
        size_t nl = d == '\n' ? 1 : d == '\r' && peek_at(p, i + 2) == '\n' ? 2 : 0;
        if (nl) {  // a backslash-continued line: the string goes on
            if (raw) cfg_buf_put(&b, p->text + i, 1 + nl);
            i += 1 + nl;
            p->line++;
            p->line_start = i;
        } else if (d < 0 || d == 0) {
            i++;  // the unterminated or NUL error, next time round
        } else if (raw) {
            cfg_buf_put(&b, p->text + i, 2);  // r'\'' is \'
            i += 2;
        } else if ((st = lex_escape(p, i, &b, &i)) != CT_OK) {
            break;
        }
    }
    if (st != CT_OK) {
        ct_free(b.s);
        return st;
    }
    t->kind = T_STRING;
    t->s = b.s;
    t->s_len = b.len;
    p->pos = i + 1;
    return CT_OK;
}

// Whether s[0..n) is one of Python 3's string prefixes: r u b f, rb br rf fr
// (any case).
static bool is_string_prefix(const char *s, size_t n) {
    int a = s[0] | 0x20, b = n == 2 ? s[1] | 0x20 : 0;
    if (n == 1) return a == 'r' || a == 'u' || a == 'b' || a == 'f';
    return n == 2 && ((a == 'r' && (b == 'b' || b == 'f')) || ((a == 'b' || a == 'f') && b == 'r'));
}

// Python's string prefixes that can stand before a quote (u'' and r'' read
// as text, as in gin; bytes and f-strings are refused).
static ct_status lex_prefixed_string(parser *p, token *t, size_t name_len) {
    const char *s = p->text + p->pos;
    int col = col_of(p, p->pos);
    bool raw = false, bytes = false, fmt = false;
    for (size_t k = 0; k < name_len; k++) {
        int c = s[k] | 0x20;
        raw |= c == 'r';
        bytes |= c == 'b';
        fmt |= c == 'f';
    }
    if (bytes)
        return fail_at(p, p->line, col, "bytes literals (%.*s'...') are not supported: write a plain string",
                       (int)name_len, s);
    if (fmt)
        return fail_at(p, p->line, col,
                       "f-strings (%.*s'...') are not literals, and gin refuses them: write a plain string",
                       (int)name_len, s);
    p->pos += name_len;
    return lex_string(p, t, raw);
}

// Reads the next token into p->tok (the old one is released).
static ct_status next(parser *p) {
    tok_clear(&p->tok);
    token *t = &p->tok;
    for (;;) {
        int c = peek_at(p, p->pos);
        if (c == ' ' || c == '\t' || c == '\r' || c == '\f') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->text[p->pos] != '\n') p->pos++;
        } else if (c == '\\' && peek_at(p, p->pos + 1) == '\n') {
            p->pos += 2;
            newline(p);
        } else if (c == '\\' && peek_at(p, p->pos + 1) == '\r' && peek_at(p, p->pos + 2) == '\n') {
            p->pos += 3;
            newline(p);
        } else if (c == '\n') {
            t->line = p->line;
            t->col = col_of(p, p->pos);
            p->pos++;
            newline(p);
            if (p->depth == 0) {
                t->kind = T_NEWLINE;
                return CT_OK;
            }
        } else {
            break;
        }
    }
    t->line = p->line;
    t->col = col_of(p, p->pos);
    t->start = p->text + p->pos;
    int c = peek_at(p, p->pos);
    if (c < 0) {
        t->kind = T_EOF;
        return CT_OK;
    }
    if (is_name_start(c)) {
        size_t e = p->pos;
        while (is_name_char(peek_at(p, e))) e++;
        if ((peek_at(p, e) == '\'' || peek_at(p, e) == '"') && is_string_prefix(p->text + p->pos, e - p->pos))
            return lex_prefixed_string(p, t, e - p->pos);
        t->kind = T_NAME;
        t->len = e - p->pos;
        p->pos = e;
        return CT_OK;
    }
    if (is_digit(c) || (c == '.' && is_digit(peek_at(p, p->pos + 1)))) return lex_number(p, t);
    if (c == '\'' || c == '"') return lex_string(p, t, false);
    if (strchr("=,:()[]{}@%/.-+", c) && c != 0) {
        if (c == '(' || c == '[' || c == '{') p->depth++;
        if ((c == ')' || c == ']' || c == '}') && p->depth > 0) p->depth--;
        t->kind = T_PUNCT;
        t->c = (char)c;
        p->pos++;
        return CT_OK;
    }
    return bad_char(p, c);
}

// What the current token is, for "expected X, got Y".
static const char *tok_desc(const token *t, char *buf, size_t n) {
    switch (t->kind) {
    case T_EOF: return "the end of the file";
    case T_NEWLINE: return "the end of the line";
    case T_NAME: snprintf(buf, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->start); return buf;
    case T_INT:
    case T_FLOAT: return "a number";
    case T_STRING: return "a string";
    case T_PUNCT: snprintf(buf, n, "'%c'", t->c); return buf;
    }
    return "?";
}

static bool is_punct(const parser *p, char c) { return p->tok.kind == T_PUNCT && p->tok.c == c; }
static bool is_name(const parser *p, const char *s) {
    return p->tok.kind == T_NAME && p->tok.len == strlen(s) && !memcmp(p->tok.start, s, p->tok.len);
}

static ct_status expected(parser *p, const char *what) {
    char b[64];
    return fail_at(p, p->tok.line, p->tok.col, "expected %s, got %s", what, tok_desc(&p->tok, b, sizeof b));
}

// ---- Parser ------------------------------------------------------------------------------

// NAME (('.' | '/') NAME)* into out; what names it in errors.
static ct_status parse_dotted(parser *p, cfg_buf *out, const char *what) {
    if (p->tok.kind != T_NAME) return expected(p, what);
    for (;;) {
        cfg_buf_put(out, p->tok.start, p->tok.len);
        CT_TRY(next(p));
        if (!is_punct(p, '.') && !is_punct(p, '/')) return CT_OK;
        cfg_buf_put(out, &p->tok.c, 1);
        CT_TRY(next(p));
        if (p->tok.kind != T_NAME) return expected(p, "a name after '.' or '/'");
    }
}

static ct_status parse_value(parser *p, ct_config_value *v, int nest);

// Items until close, separated by commas (a trailing one allowed). For dicts
// (close '}') each item is key ':' value.
static ct_status parse_items(parser *p, ct_config_value *v, char close, int nest) {
    int cap = 0;
    bool dict = close == '}';
    for (;;) {
        if (is_punct(p, close)) break;
        int per = dict ? 2 : 1;
        if ((v->n + 1) * per > cap) {
            cap = cap ? 2 * cap : 4 * per;
            v->items = ct_realloc(v->items, (size_t)cap * sizeof *v->items);
        }
        ct_config_value *it = &v->items[v->n * per];
        memset(it, 0, (size_t)per * sizeof *it);
        v->n++;  // counted now, so a failure below frees what was parsed
        CT_TRY(parse_value(p, &it[0], nest + 1));
        if (dict) {
            if (!is_punct(p, ':')) return expected(p, "':' after a dict key");
            CT_TRY(next(p));
            CT_TRY(parse_value(p, &it[1], nest + 1));
        }
        if (is_punct(p, ',')) {
            CT_TRY(next(p));
            continue;
        }
        if (is_punct(p, close)) break;
        char what[48];
        snprintf(what, sizeof what, "',' or '%c'", close);
        return expected(p, what);
    }
    return next(p);  // past close
}

// A number after a sign ('-' or '+' is the current token).
static ct_status parse_signed(parser *p, ct_config_value *v) {
    token *t = &p->tok;
    bool neg = t->c == '-';
    CT_TRY(next(p));
    if (t->kind == T_INT) {
        if (!neg && t->u > (uint64_t)INT64_MAX) return fail_at(p, v->line, v->col, "integer does not fit in 64 bits");
        v->kind = CT_CONFIG_INT;
        v->i = neg ? (int64_t)(0 - t->u) : (int64_t)t->u;
    } else if (t->kind == T_FLOAT) {
        v->kind = CT_CONFIG_FLOAT;
        v->f = neg ? -t->f : t->f;
    } else {
        return expected(p, "a number after the sign");
    }
    return next(p);
}

// Adjacent strings join, as in Python: 'a' 'b' is 'ab'.
static ct_status parse_strings(parser *p, ct_config_value *v) {
    cfg_buf b = {0};
    cfg_buf_put(&b, "", 0);
    while (p->tok.kind == T_STRING) {
        cfg_buf_put(&b, p->tok.s, p->tok.s_len);
        ct_status st = next(p);
        if (st != CT_OK) {
            ct_free(b.s);
            return st;
        }
    }
    v->kind = CT_CONFIG_STRING;
    v->s = b.s;
    return CT_OK;
}

// True, False or None; any other bare name is an error.
static ct_status parse_name(parser *p, ct_config_value *v) {
    token *t = &p->tok;
    if (is_name(p, "True") || is_name(p, "False")) {
        v->kind = CT_CONFIG_BOOL;
        v->b = is_name(p, "True");
        return next(p);
    }
    if (is_name(p, "None")) {
        v->kind = CT_CONFIG_NONE;
        return next(p);
    }
    return fail_at(p, t->line, t->col,
                   "expected a value, got the name '%.*s' (strings need quotes, references start with @, "
                   "macros with %%)",
                   (int)(t->len > 40 ? 40 : t->len), t->start);
}

// @Name, @Name() or %MACRO ('@' or '%' is the current token).
static ct_status parse_ref_or_macro(parser *p, ct_config_value *v) {
    bool ref = p->tok.c == '@';
    CT_TRY(next(p));
    cfg_buf b = {0};
    ct_status st = parse_dotted(p, &b, ref ? "a configurable's name after '@'" : "a macro name after '%'");
    v->kind = ref ? CT_CONFIG_REFERENCE : CT_CONFIG_MACRO;
    v->s = b.s;
    CT_TRY(st);
    if (ref && is_punct(p, '(')) {
        CT_TRY(next(p));
        if (!is_punct(p, ')')) return expected(p, "')' (a reference @Name() takes no arguments)");
        v->call = true;
        CT_TRY(next(p));
    }
    return CT_OK;
}

// Refused while parsing, before a 60 MB list of items is held in memory.
static ct_status too_many_items(parser *p) {
    return fail_at(p, p->value_line, p->value_col, "a value of more than %d items (nested ones counted): too big",
                   CFG_MAX_VALUE_NODES);
}

// A tuple (after its '('): (), (x) is x, (x,), (x, y, ...).
static ct_status parse_tuple(parser *p, ct_config_value *v, int nest) {
    v->kind = CT_CONFIG_TUPLE;
    if (is_punct(p, ')')) return next(p);
    // (x) is x: the parentheses are no item of their own unless a ',' makes
    // them a tuple, so they leave the item count while x is read (x's items
    // meet the limit as a bare x's would). They do count as a level of
    // nesting: the parser recurses through them.
    p->nodes--;
    ct_config_value first;
    ct_status st = parse_value(p, &first, nest + 1);
    if (st != CT_OK) {
        cfg_value_free(&first);
        return st;
    }
    if (is_punct(p, ')')) {  // (x) is x
        *v = first;
        return next(p);
    }
    if (!is_punct(p, ',')) {
        cfg_value_free(&first);
        return expected(p, "',' or ')'");
    }
    if (++p->nodes > CFG_MAX_VALUE_NODES) {  // a tuple after all
        cfg_value_free(&first);
        return too_many_items(p);
    }
    v->items = ct_malloc(sizeof *v->items);
    v->items[0] = first;
    v->n = 1;
    CT_TRY(next(p));
    if (is_punct(p, ')')) return next(p);
    // The rest as a list, appended.
    ct_config_value rest = {0};
    st = parse_items(p, &rest, ')', nest);
    v->items = ct_realloc(v->items, (size_t)(1 + rest.n) * sizeof *v->items);
    if (rest.n) memcpy(v->items + 1, rest.items, (size_t)rest.n * sizeof *v->items);
    v->n += rest.n;
    ct_free(rest.items);
    return st;
}

static ct_status parse_value(parser *p, ct_config_value *v, int nest) {
    memset(v, 0, sizeof *v);
    v->file = p->source;
    v->line = p->tok.line;
    v->col = p->tok.col;
    if (nest > MAX_NESTING) return fail_at(p, v->line, v->col, "values nested deeper than %d", MAX_NESTING);
    if (nest == 0) {
        p->nodes = 0;
        p->value_line = v->line;
        p->value_col = v->col;
    } else if (++p->nodes > CFG_MAX_VALUE_NODES) {
        return too_many_items(p);
    }
    token *t = &p->tok;
    switch (t->kind) {
    case T_INT:
        if (t->u > (uint64_t)INT64_MAX) return fail_at(p, v->line, v->col, "integer does not fit in 64 bits");
        v->kind = CT_CONFIG_INT;
        v->i = (int64_t)t->u;
        return next(p);
    case T_FLOAT:
        v->kind = CT_CONFIG_FLOAT;
        v->f = t->f;
        return next(p);
    case T_STRING:
        return parse_strings(p, v);
    case T_NAME:
        return parse_name(p, v);
    case T_PUNCT:
        break;
    default:
        return expected(p, "a value");
    }
    switch (t->c) {
    case '-':
    case '+':
        return parse_signed(p, v);
    case '@':
    case '%':
        return parse_ref_or_macro(p, v);
    case '[':
    case '{':
        v->kind = t->c == '[' ? CT_CONFIG_LIST : CT_CONFIG_DICT;
        CT_TRY(next(p));
        return parse_items(p, v, v->kind == CT_CONFIG_LIST ? ']' : '}', nest);
    case '(':
        CT_TRY(next(p));
        return parse_tuple(p, v, nest);
    default:
        return expected(p, "a value");
    }
}

// path from dir ("" for the working directory), unless path is absolute.
static char *join_path(const char *dir, const char *path) {
    cfg_buf b = {0};
    if (path[0] != '/' && dir[0]) {
        cfg_buf_puts(&b, dir);
        cfg_buf_puts(&b, "/");
    }
    cfg_buf_puts(&b, path);
    return b.s;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    cfg_buf b = {0};
    if (!slash) cfg_buf_puts(&b, "");
    else if (slash == path) cfg_buf_puts(&b, "/");
    else cfg_buf_put(&b, path, (size_t)(slash - path));
    return b.s;
}

// A config file (a regular file of at most MAX_FILE_BYTES), malloc'ed: free() it.
static ct_status read_file(const char *path, char **out, size_t *len, ct_error *err) {
    return ct_fs_read_max(path, MAX_FILE_BYTES, out, len, err);
}

static ct_status parse_text(ct_config *cfg, const char *text, size_t len, const char *source, const char *dir,
                            bool override, ct_error *err);

// Appends "\n  included from SRC:LINE" to err's message, if it fits.
static void note_included_from(ct_error *err, const char *source, int line) {
    if (!err) return;
    size_t n = strlen(err->msg);
    if (n + 1 < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - n, " (included from %s:%d)", source, line);
}

// The file an include names, as the path to open (*full, ct_free it) and
// its realpath (*real, free it). gin opens the name as given, from the
// working directory; ctrax's configs name it from the including file's
// directory. A relative name is looked for both ways: found one way, it is
// that file; found both ways as two different files, it is an error (which
// one the author meant cannot be told, and gin would read the second).
static ct_status include_file(parser *p, const char *path, int line, int col, char **full, char **real) {
    *full = join_path(p->dir, path);
    *real = realpath(*full, NULL);
    int beside_errno = errno;
    if (path[0] == '/' || !p->dir[0]) {  // one place only
        if (*real) return CT_OK;
        ct_status st = fail_at(p, line, col, "include '%s': cannot open '%s': %s", path, *full, strerror(beside_errno));
        ct_free(*full);
        return st;
    }
    char *from_cwd = realpath(path, NULL);
    int cwd_errno = errno;
    ct_status st = CT_OK;
    if (!*real && !from_cwd)
        st = fail_at(p, line, col,
                     "include '%s': cannot open '%s' (beside the including file): %s; nor '%s' (from the working "
                     "directory, where gin looks): %s",
                     path, *full, strerror(beside_errno), path, strerror(cwd_errno));
    else if (*real && from_cwd && strcmp(*real, from_cwd))
        st = fail_at(p, line, col,
                     "include '%s': two files by that name, '%s' beside the including file and '%s' in the working "
                     "directory (gin reads that one): rename one, or name it by an absolute path",
                     path, *full, path);
    else if (!*real) {
        ct_free(*full);
        *full = join_path("", path);
        *real = from_cwd;
        return CT_OK;
    }
    free(from_cwd);
    if (st != CT_OK) {
        free(*real);
        ct_free(*full);
    }
    return st;
}

static ct_status do_include(parser *p, const char *path, int line, int col) {
    if (!path[0]) return fail_at(p, line, col, "include '': the file name is empty");
    char *full, *real;
    ct_status st = include_file(p, path, line, col, &full, &real);
    if (st != CT_OK) return st;
    int pushed = cfg_include_push(p->cfg, real, MAX_INCLUDE_DEPTH);
    if (pushed == -2 || pushed == -3) {
        st = pushed == -2 ? fail_at(p, line, col, "include '%s': includes nested deeper than %d", path, MAX_INCLUDE_DEPTH)
                          : fail_at(p, line, col, "include '%s': more than %d includes in all (includes that multiply?)",
                                    path, CFG_MAX_INCLUDES);
        free(real);
        ct_free(full);
        return st;
    }
    if (pushed == -1) {
        cfg_buf chain = {0};
        cfg_include_chain(p->cfg, real, &chain);
        st = fail_at(p, line, col, "include '%s': include cycle: %s%s", path, chain.s ? chain.s : "", full);
        ct_free(chain.s);
        free(real);
        ct_free(full);
        return st;
    }
    char *text = NULL;
    size_t len = 0;
    st = read_file(full, &text, &len, p->err);
    if (st != CT_OK) {
        ct_error_prefix(p->err, "%s:%d:%d: include '%s'", p->source, line, col, path);
    } else {
        char *dir = dir_of(full);
        st = parse_text(p->cfg, text, len, cfg_intern(p->cfg, full), dir, p->override, p->err);
        if (st != CT_OK) note_included_from(p->err, p->source, line);
        ct_free(dir);
    }
    free(text);
    cfg_include_pop(p->cfg);
    free(real);
    ct_free(full);
    return st;
}

static ct_status end_of_statement(parser *p) {
    if (p->tok.kind != T_NEWLINE && p->tok.kind != T_EOF) return expected(p, "the end of the line");
    return CT_OK;
}

static ct_status statement(parser *p) {
    token *t = &p->tok;
    int line = t->line, col = t->col;
    if (is_name(p, "include")) {
        CT_TRY(next(p));
        if (t->kind == T_STRING) {
            char *path = t->s;
            t->s = NULL;
            ct_status st = next(p);
            if (st == CT_OK) st = end_of_statement(p);
            if (st == CT_OK) st = do_include(p, path, line, col);
            ct_free(path);
            return st;
        }
        if (!is_punct(p, '.') && !is_punct(p, '/') && !is_punct(p, '='))
            return expected(p, "a quoted file name after include");
        // else a binding that starts with the name "include": unusual, but a name.
        return fail_at(p, line, col, "'include' is a keyword: expected include 'file.gin'");
    }
    if (is_name(p, "import")) {  // gin's Python imports mean nothing here
        CT_TRY(next(p));
        cfg_buf b = {0};
        ct_status st = parse_dotted(p, &b, "a module name after import");
        ct_free(b.s);
        CT_TRY(st);
        return end_of_statement(p);
    }
    if (t->kind != T_NAME) return expected(p, "a binding (Name.param = value), a macro (NAME = value) or include");
    cfg_buf key = {0};
    ct_status st = parse_dotted(p, &key, "a name");
    if (st == CT_OK && !is_punct(p, '=')) {
        char what[128];
        snprintf(what, sizeof what, "'=' after '%.60s'", key.s);
        st = expected(p, what);
    }
    ct_config_value v = {0};
    if (st == CT_OK) st = next(p);
    if (st == CT_OK) st = parse_value(p, &v, 0);
    if (st == CT_OK) st = end_of_statement(p);
    if (st == CT_OK) st = cfg_bind(p->cfg, key.s, p->source, line, col, &v, p->override, p->err);
    cfg_value_free(&v);
    ct_free(key.s);
    return st;
}

static ct_status parse_text(ct_config *cfg, const char *text, size_t len, const char *source, const char *dir,
                            bool override, ct_error *err) {
    parser p = {.cfg = cfg, .source = source, .dir = dir, .text = text, .len = len, .line = 1,
                .override = override, .err = err};
    ct_status st = next(&p);
    while (st == CT_OK && p.tok.kind != T_EOF) {
        if (p.tok.kind == T_NEWLINE) {
            st = next(&p);
            continue;
        }
        st = statement(&p);
        if (st == CT_OK && p.tok.kind == T_NEWLINE) st = next(&p);
    }
    tok_clear(&p.tok);
    return st;
}

ct_status cfg_parse(ct_config *cfg, const char *text, size_t len, const char *source, bool override,
                    ct_error *err) {
    return parse_text(cfg, text, len, cfg_intern(cfg, source), "", override, err);
}

ct_status cfg_parse_file(ct_config *cfg, const char *path, bool override, ct_error *err) {
    char *real = realpath(path, NULL);
    if (!real) return ct_error_set(err, CT_ERR_IO, "cannot open config '%s': %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    ct_status st = read_file(path, &text, &len, err);
    if (st == CT_OK) {
        cfg_include_push(cfg, real, MAX_INCLUDE_DEPTH);
        char *dir = dir_of(path);
        st = parse_text(cfg, text, len, cfg_intern(cfg, path), dir, override, err);
        ct_free(dir);
        cfg_include_pop(cfg);
    }
    free(text);
    free(real);
    return st;
}

ct_status cfg_parse_value(ct_config *cfg, const char *text, const char *source, ct_config_value *out,
                          ct_error *err) {
    parser p = {.cfg = cfg, .source = cfg_intern(cfg, source), .dir = "", .text = text, .len = strlen(text),
                .line = 1, .err = err};
    memset(out, 0, sizeof *out);
    ct_status st = next(&p);
    if (st == CT_OK) st = parse_value(&p, out, 0);
    while (st == CT_OK && p.tok.kind == T_NEWLINE) st = next(&p);
    if (st == CT_OK && p.tok.kind != T_EOF) st = expected(&p, "the end of the value");
    tok_clear(&p.tok);
    if (st != CT_OK) cfg_value_free(out);
    return st;
}
