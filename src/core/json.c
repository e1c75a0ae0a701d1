// ct_json_parse: cJSON, then a check that no object holds a key twice.
#include "core/json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Where the path to an object is too long for the buffer it is cut short.
#define PATH_MAX_CHARS 256

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Appends ".key" or "[i]" to path (cut short when it does not fit).
static void path_push(char *path, const cJSON *parent, const cJSON *child, int index) {
    size_t len = strlen(path);
    if (len + 1 >= PATH_MAX_CHARS) return;
    if (cJSON_IsObject(parent)) snprintf(path + len, PATH_MAX_CHARS - len, "%s%s", len ? "." : "", child->string);
    else snprintf(path + len, PATH_MAX_CHARS - len, "[%d]", index);
}

// Checks j and everything below it. Keys are sorted per object (n log n: a
// 100 MB safetensors header may hold a million keys). The depth is bounded by
// cJSON's nesting limit (CJSON_NESTING_LIMIT, 1000).
static ct_status check_unique(const cJSON *j, char *path, const char *what, ct_error *err) {
    if (!cJSON_IsObject(j) && !cJSON_IsArray(j)) return CT_OK;
    if (cJSON_IsObject(j)) {
        int n = cJSON_GetArraySize(j);
        if (n > 1) {
            const char **keys = malloc((size_t)n * sizeof *keys);
            if (!keys) return ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory checking the JSON", what);
            int k = 0;
            const cJSON *c;
            cJSON_ArrayForEach(c, j) keys[k++] = c->string;
            qsort(keys, (size_t)n, sizeof *keys, cmp_key);
            for (int i = 1; i < n; i++)
                if (!strcmp(keys[i - 1], keys[i])) {
                    ct_status s = ct_error_set(err, CT_ERR_FORMAT, "%s: key '%s' appears twice in the %s%s", what,
                                               keys[i], path[0] ? "object at " : "top-level object", path);
                    free(keys);
                    return s;
                }
            free(keys);
        }
    }
    size_t len = strlen(path);
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, j) {
        path_push(path, j, c, i++);
        ct_status s = check_unique(c, path, what, err);
        path[len] = '\0';
        if (s != CT_OK) return s;
    }
    return CT_OK;
}

// cJSON's strings are NUL-terminated: a "\u0000" (or a raw NUL byte, which
// it lets through) inside one cuts the string short there, so the key
// "a\u0000b" reads as "a" and two distinct keys become one. ctrax writes no
// such string; one in a file is refused. text holds one valid JSON value
// (cJSON parsed it), so backslashes and quotes are only those of strings.
static ct_status check_no_nul(const char *text, size_t len, const char *what, ct_error *err) {
    size_t start = 0;
    bool in_string = false, nul = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (!in_string) {
            if (c == '"') in_string = true, start = i, nul = false;
        } else if (c == '\\') {
            nul |= i + 5 < len && text[i + 1] == 'u' && !memcmp(text + i + 2, "0000", 4);
            i++;  // the escaped character: an escaped quote or backslash is no delimiter
        } else if (c == '\0') {
            nul = true;
        } else if (c == '"') {
            in_string = false;
            if (!nul) continue;
            // A key is followed by ':'; anything else is a value.
            size_t k = i + 1;
            while (k < len && (text[k] == ' ' || text[k] == '\t' || text[k] == '\n' || text[k] == '\r')) k++;
            int line = 1, col = 1;
            for (size_t p = 0; p < start; p++) {
                if (text[p] == '\n') line++, col = 1;
                else col++;
            }
            return ct_error_set(err, CT_ERR_FORMAT,
                                "%s: the %s at line %d, column %d holds a NUL (\\u0000), which would cut it short: "
                                "refused",
                                what, k < len && text[k] == ':' ? "key" : "string value", line, col);
        }
    }
    return CT_OK;
}

uint64_t ct_json_values_bound(const char *text, size_t len) {
    uint64_t values = 1;  // every value but the first follows one of , [ {
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') i++;  // the escaped character cannot end the string
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == ',' || c == '[' || c == '{') {
            values++;
        }
    }
    return values;
}

// cJSON's allocations are counted while ct_json_parse_within runs on this
// thread: a text of small values takes some 40 times its size (80 bytes a
// value), so a hostile file's size alone does not bound what parsing it
// takes. Outside a parse nothing is counted; free is free.
static _Thread_local bool budget_on, budget_spent;
static _Thread_local size_t budget_left;

static void *budget_malloc(size_t n) {
    if (budget_on) {
        if (n > budget_left) {
            budget_spent = true;
            return NULL;  // cJSON gives up, freeing what it built
        }
        budget_left -= n;
    }
    return malloc(n);
}

// Before main (one thread): every cJSON allocation, counted or not, goes
// through budget_malloc, so any of them may be freed by cJSON_Delete.
__attribute__((constructor)) static void install_cjson_hooks(void) {
    cJSON_Hooks hooks = {budget_malloc, free};
    cJSON_InitHooks(&hooks);
}

cJSON *ct_json_parse(const char *text, size_t len, const char *what, ct_error *err) {
    return ct_json_parse_within(text, len, what, CT_JSON_PARSE_BUDGET, err);
}

cJSON *ct_json_parse_within(const char *text, size_t len, const char *what, size_t budget, ct_error *err) {
    if (!what) what = "JSON";
    const char *end = NULL;
    budget_on = true;
    budget_spent = false;
    budget_left = budget;
    cJSON *root = text ? cJSON_ParseWithLengthOpts(text, len, &end, false) : NULL;
    budget_on = false;
    if (!root && budget_spent) {
        ct_error_set(err, CT_ERR_FORMAT, "%s: parsing its %zu bytes would take more than %zu MiB: too many values "
                     "(damaged or hostile), refused", what, len, budget >> 20);
        return NULL;
    }
    if (!root) {
        // cJSON leaves end at the failure (or at the start when it gave up at once).
        size_t at = text && end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < at; i++) {
            if (text[i] == '\n') line++, col = 1;
            else col++;
        }
        ct_error_set(err, CT_ERR_FORMAT, "%s: not valid JSON (line %d, column %d)", what, line, col);
        return NULL;
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            size_t at = (size_t)(p - text);
            int line = 1;
            for (size_t i = 0; i < at; i++) line += text[i] == '\n';
            ct_error_set(err, CT_ERR_FORMAT, "%s: more after the JSON value (line %d, byte %zu)", what, line, at);
            cJSON_Delete(root);
            return NULL;
        }
    char path[PATH_MAX_CHARS] = "";
    // Before the duplicate check: "a\u0000b" and "a\u0000c" are not the same key.
    if (check_no_nul(text, (size_t)(end - text), what, err) != CT_OK || check_unique(root, path, what, err) != CT_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *ct_json_int(int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_CreateRaw(buf);
}

size_t ct_utf8_len(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || n < len) return 0;
    // The second byte's range narrows after E0, ED, F0 and F4.
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    return len;
}

size_t ct_utf8_valid_prefix(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = ct_utf8_len(u + i, n - i);
        if (k == 0) return i;
        i += k;
    }
    return n;
}

bool ct_utf8_valid(const char *s) { return s[ct_utf8_valid_prefix(s)] == '\0'; }

ct_status ct_utf8_check_name(const char *s, const char *what, const char *where, ct_error *err) {
    size_t at = ct_utf8_valid_prefix(s);
    if (!s[at]) return CT_OK;
    // The valid start as it is, the byte that breaks it escaped: the message
    // itself stays UTF-8.
    return ct_error_set(err, CT_ERR_ARG, "%s: %s '%.*s\\x%02x...' is not valid UTF-8 at byte %zu: it goes into "
                        "files that hold UTF-8 text only", where, what, (int)at, s, (unsigned)(unsigned char)s[at], at);
}
