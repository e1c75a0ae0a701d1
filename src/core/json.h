// The one JSON parser for what ctrax reads from files (internal).
//
// cJSON accepts an object that holds the same key twice, and lookups then
// see one of the two while code that walks the members sees both: a
// checkpoint's state.json or a safetensors header could say one thing to
// one reader and another to the next (safetensors' __metadata__ twice
// once overflowed an array). A NUL in a string ("a\u0000b") does the same:
// cJSON's strings end at it, so the key reads as "a". Every JSON file ctrax
// reads goes through ct_json_parse, which refuses both.
#ifndef CTRAX_CORE_JSON_H
#define CTRAX_CORE_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrax/core/error.h"

// Parses len bytes of text (NUL-terminated or not) as one JSON value, with
// nothing but whitespace after it, and checks that no string in it holds a
// NUL (escaped or raw) and no object anywhere in it holds a key twice. what
// names the file for errors ("run/model_2/state.json", "metrics.jsonl:12").
// Returns the tree (cJSON_Delete it), or NULL with CT_ERR_FORMAT: "<what>:
// not valid JSON (line L, column C)", "<what>: the key at line L, column C
// holds a NUL ..." (or "the string value at") or "<what>: key 'k' appears
// twice in the object at <path>"; CT_ERR_MEMORY when out of memory. err may
// be NULL.
// Parsing stops, with CT_ERR_FORMAT ("<what>: parsing its N bytes would
// take more than M MiB ..."), once cJSON has allocated CT_JSON_PARSE_BUDGET
// bytes: some 13M values, where ctrax's largest legitimate file (a long
// run's state.json history) holds far fewer.
cJSON *ct_json_parse(const char *text, size_t len, const char *what, ct_error *err);
#define CT_JSON_PARSE_BUDGET ((size_t)1 << 30)
// ct_json_parse with a budget of its own (tests).
cJSON *ct_json_parse_within(const char *text, size_t len, const char *what, size_t budget, ct_error *err);

// An upper bound on the number of JSON values in len bytes of text: one,
// and one more for each ',', '[' and '{' outside a string. cJSON takes some
// 80 bytes per value (a 100 MB text of 50M zeros parsed to 3.9 GB), so a
// reader of a file whose legitimate size it knows counts before parsing.
uint64_t ct_json_values_bound(const char *text, size_t len);

// An integer as a raw JSON number with all its digits (a cJSON number goes
// through a double and loses those past 2^53). NULL when out of memory.
cJSON *ct_json_int(int64_t v);

// JSON text is UTF-8 (RFC 8259), and so is what a JSON file ctrax writes
// holds. The length (1 to 4) of the valid UTF-8 sequence (RFC 3629: no
// overlong forms, surrogates or code points past U+10FFFF) at the start of
// the n bytes at s, or 0 when they do not start one (n 0 included).
size_t ct_utf8_len(const unsigned char *s, size_t n);
// Whether the NUL-terminated s is valid UTF-8 throughout.
bool ct_utf8_valid(const char *s);
// The offset of the first byte of the NUL-terminated s that does not start a
// valid sequence (the length of its valid start: an error message can show
// that much and name the byte); strlen(s) when s is valid throughout.
size_t ct_utf8_valid_prefix(const char *s);
// CT_OK when the NUL-terminated s is valid UTF-8; else CT_ERR_ARG with
// "<where>: <what> '<valid start>\xNN...' is not valid UTF-8 at byte N: ...",
// for a name that goes into a file that must be UTF-8 (metrics.jsonl, a
// TensorBoard tag).
ct_status ct_utf8_check_name(const char *s, const char *what, const char *where, ct_error *err);

#endif
