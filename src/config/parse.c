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

static ct_status lex_number(parser *p, token *t) {
    size_t b = p->pos, e = b;
    bool is_float = false, hex = false;
    char digits[128];
    size_t nd = 0;
    if (peek_at(p, e) == '0' && (peek_at(p, e + 1) == 'x' || peek_at(p, e + 1) == 'X')) {
        hex = true;
        e += 2;
        while (is_hex(peek_at(p, e)) || peek_at(p, e) == '_') e++;
    } else {
        while (is_digit(peek_at(p, e)) || peek_at(p, e) == '_') e++;
        if (peek_at(p, e) == '.') {
            is_float = true;
            e++;
            while (is_digit(peek_at(p, e)) || peek_at(p, e) == '_') e++;
        }
        if (peek_at(p, e) == 'e' || peek_at(p, e) == 'E') {
            size_t x = e + 1;
            if (peek_at(p, x) == '+' || peek_at(p, x) == '-') x++;
            if (!is_digit(peek_at(p, x)))
                return fail_at(p, p->line, col_of(p, e), "expected digits after the exponent");
            is_float = true;
            e = x;
            while (is_digit(peek_at(p, e))) e++;
        }
    }
    if (is_name_char(peek_at(p, e)) || peek_at(p, e) == '.') {
        while (is_name_char(peek_at(p, e)) || peek_at(p, e) == '.') e++;
        int n = (int)(e - b) > 40 ? 40 : (int)(e - b);
        return fail_at(p, p->line, col_of(p, b), "invalid number '%.*s'", n, p->text + b);
    }
    for (size_t i = hex ? b + 2 : b; i < e; i++) {
        if (p->text[i] == '_') continue;
        if (nd + 1 >= sizeof digits) return fail_at(p, p->line, col_of(p, b), "number too long");
        digits[nd++] = p->text[i];
    }
    digits[nd] = '\0';
    if (nd == 0 || (p->text[e - 1] == '_'))
        return fail_at(p, p->line, col_of(p, b), "invalid number '%.*s'", (int)(e - b), p->text + b);
    errno = 0;
    if (is_float) {
        t->kind = T_FLOAT;
        t->f = strtod(digits, NULL);
        if (errno == ERANGE && isinf(t->f))
            return fail_at(p, p->line, col_of(p, b), "float %.*s is out of range", (int)(e - b), p->text + b);
    } else {
        t->kind = T_INT;
        t->u = strtoull(digits, NULL, hex ? 16 : 10);
        if (errno == ERANGE || t->u > (uint64_t)INT64_MAX + 1)
            return fail_at(p, p->line, col_of(p, b), "integer %.*s does not fit in 64 bits", (int)(e - b),
                           p->text + b);
    }
    p->pos = e;
    return CT_OK;
}

static ct_status lex_string(parser *p, token *t) {
    char q = p->text[p->pos];
    int col = col_of(p, p->pos);
    size_t i = p->pos + 1;
    cfg_buf b = {0};
    cfg_buf_put(&b, "", 0);
    for (;;) {
        int c = peek_at(p, i);
        if (c < 0 || c == '\n') {
            ct_free(b.s);
            return fail_at(p, p->line, col, "unterminated string (expected a closing %c on this line)", q);
        }
        if (c == 0) {
            ct_free(b.s);
            return fail_at(p, p->line, col_of(p, i), "unexpected NUL byte in a string");
        }
        if (c == q) break;
        if (c != '\\') {
            cfg_buf_put(&b, p->text + i, 1);
            i++;
            continue;
        }
        int d = peek_at(p, i + 1);
        char ch;
        i += 2;
        switch (d) {
        case 'n': ch = '\n'; break;
        case 't': ch = '\t'; break;
        case 'r': ch = '\r'; break;
        case '\\': ch = '\\'; break;
        case '\'': ch = '\''; break;
        case '"': ch = '"'; break;
        case 'x':
            if (!is_hex(peek_at(p, i)) || !is_hex(peek_at(p, i + 1))) {
                ct_free(b.s);
                return fail_at(p, p->line, col_of(p, i - 2), "expected two hex digits after \\x");
            }
            ch = (char)strtol((char[]){p->text[i], p->text[i + 1], 0}, NULL, 16);
            i += 2;
            if (ch == 0) {
                ct_free(b.s);
                return fail_at(p, p->line, col_of(p, i - 4), "\\x00 is not allowed in a string");
            }
            break;
        default:  // as Python: an unknown escape keeps its backslash
            if (d < 0 || d == '\n' || d == 0) {
                ct_free(b.s);
                return fail_at(p, p->line, col, "unterminated string (expected a closing %c on this line)", q);
            }
            cfg_buf_put(&b, "\\", 1);
            ch = (char)d;
        }
        cfg_buf_put(&b, &ch, 1);
    }
    t->kind = T_STRING;
    t->s = b.s;
    t->s_len = b.len;
    p->pos = i + 1;
    return CT_OK;
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
        t->kind = T_NAME;
        t->len = e - p->pos;
        p->pos = e;
        return CT_OK;
    }
    if (is_digit(c) || (c == '.' && is_digit(peek_at(p, p->pos + 1)))) return lex_number(p, t);
    if (c == '\'' || c == '"') return lex_string(p, t);
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

// A tuple (after its '('): (), (x) is x, (x,), (x, y, ...).
static ct_status parse_tuple(parser *p, ct_config_value *v, int nest) {
    v->kind = CT_CONFIG_TUPLE;
    if (is_punct(p, ')')) return next(p);
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

// Where an include names: absolute, or relative to the including file.
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

static ct_status do_include(parser *p, const char *path, int line, int col) {
    if (!path[0]) return fail_at(p, line, col, "include '': the file name is empty");
    char *full = join_path(p->dir, path);
    char *real = realpath(full, NULL);
    if (!real) {
        ct_status st = fail_at(p, line, col, "include '%s': cannot open '%s': %s", path, full, strerror(errno));
        ct_free(full);
        return st;
    }
    ct_status st;
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
