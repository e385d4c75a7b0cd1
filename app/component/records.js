/* Generated from engine/core/records.py by `python -m engine.core.schema_export js`:
 * do not edit. The step record's contract as JSON Schema, and its value lists (rows.js
 * reads them). */
(function (root) {
  root.FluxoRecords = {
 "PHASES": [
  "prefill",
  "decode",
  "dead",
  "idle"
 ],
 "LANES": [
  "cpu_prepare",
  "h2d",
  "compute",
  "d2h",
  "cpu_update"
 ],
 "HOOKS": [
  "token_budget",
  "prefill_tokens",
  "preempt",
  "admit"
 ],
 "step": {
  "type": "object",
  "title": "StepRecord",
  "properties": {
   "step": {
    "type": "integer",
    "minimum": 0,
    "maximum": 1000000000000,
    "description": "1, 2, ... since the engine started (or was reset)"
   },
   "t_start": {
    "type": "number",
    "minimum": -1000000000000000.0,
    "maximum": 1000000000000000.0,
    "description": "engine clock (seconds since the engine started); state.wall_offset maps it to wall time"
   },
   "t_end": {
    "type": "number",
    "minimum": -1000000000000000.0,
    "maximum": 1000000000000000.0,
    "description": "engine clock as the step's tokens were back and streamed"
   },
   "policy": {
    "type": "string",
    "pattern": "^[A-Za-z0-9_.:-]{1,64}$",
    "maxLength": 64,
    "description": "static / continuous / chunked or a loaded policy's name, as scheduled"
   },
   "runner": {
    "enum": [
     "sync",
     "async"
    ],
    "description": "sync: prepare, execute, finish in a row; async: overlapped"
   },
   "slots": {
    "type": "array",
    "items": {
     "type": "object",
     "title": "SlotRecord",
     "properties": {
      "slot": {
       "type": "integer",
       "minimum": 0,
       "maximum": 4096,
       "description": "batch slot index"
      },
      "request": {
       "anyOf": [
        {
         "type": "integer",
         "minimum": 0,
         "maximum": 1000000000000
        },
        {
         "type": "null"
        }
       ],
       "description": "the request holding it, None when idle"
      },
      "phase": {
       "enum": [
        "prefill",
        "decode",
        "dead",
        "idle"
       ],
       "description": "dead: a static batch's ended member, still computed; idle: nothing computed"
      },
      "tokens": {
       "type": "integer",
       "minimum": 0,
       "maximum": 1000000000000,
       "description": "tokens this slot computed in the step (a prefill chunk's length, 1 for decode)"
      }
     },
     "required": [
      "slot",
      "request",
      "phase",
      "tokens"
     ]
    },
    "maxItems": 4096,
    "description": "every slot, idle ones included"
   },
   "admitted": {
    "type": "array",
    "items": {
     "type": "integer",
     "minimum": 0,
     "maximum": 1000000000000
    },
    "maxItems": 100000,
    "description": "request ids admitted in this step"
   },
   "finished": {
    "type": "array",
    "items": {
     "type": "integer",
     "minimum": 0,
     "maximum": 1000000000000
    },
    "maxItems": 100000,
    "description": "request ids that ended in this step"
   },
   "preempted": {
    "type": "array",
    "items": {
     "type": "integer",
     "minimum": 0,
     "maximum": 1000000000000
    },
    "maxItems": 100000,
    "description": "request ids preempted (their KV dropped; they wait again)"
   },
   "admitted_cached": {
    "type": "object",
    "propertyNames": {
     "pattern": "^[0-9]+$"
    },
    "additionalProperties": {
     "type": "integer",
     "minimum": 0,
     "maximum": 1000000000000
    },
    "description": "prefix cache: request id -> prompt tokens taken from the cache"
   },
   "cached_tokens": {
    "type": "integer",
    "minimum": 0,
    "maximum": 1000000000000,
    "description": "sum of admitted_cached"
   },
   "queue_len": {
    "type": "integer",
    "minimum": 0,
    "maximum": 1000000000000,
    "description": "requests waiting after the step was scheduled"
   },
   "kv": {
    "type": "object",
    "title": "KVRecord",
    "properties": {
     "blocks_total": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "description": "the presenter's budget, in blocks"
     },
     "blocks_used": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "description": "blocks referenced by at least one sequence"
     },
     "tokens_stored": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "description": "sum of num_computed over sequences holding blocks (a shared block once)"
     },
     "tokens_allocated": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "description": "blocks_used * block_size"
     },
     "blocks_shared": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "description": "prefix cache: blocks referenced by more than one sequence"
     },
     "blocks_cached": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "description": "prefix cache: free blocks whose content is still findable"
     }
    },
    "required": [
     "blocks_total",
     "tokens_stored",
     "tokens_allocated"
    ],
    "description": "the KV pool as the step leaves it"
   },
   "tokens": {
    "type": "object",
    "title": "TokenCounts",
    "properties": {
     "prefill": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "default": 0
     },
     "decode": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "default": 0
     },
     "dead": {
      "type": "integer",
      "minimum": 0,
      "maximum": 1000000000000,
      "default": 0
     }
    },
    "required": [],
    "description": "tokens computed in the step, by phase"
   },
   "spans": {
    "type": "array",
    "items": {
     "type": "object",
     "title": "SpanRecord",
     "properties": {
      "lane": {
       "enum": [
        "cpu_prepare",
        "h2d",
        "compute",
        "d2h",
        "cpu_update"
       ]
      },
      "start": {
       "type": "number",
       "minimum": -1000000000000000.0,
       "maximum": 1000000000000000.0,
       "description": "engine clock, seconds"
      },
      "end": {
       "type": "number",
       "minimum": -1000000000000000.0,
       "maximum": 1000000000000000.0
      }
     },
     "required": [
      "lane",
      "start",
      "end"
     ]
    },
    "maxItems": 64,
    "description": "measured host and device work of the step"
   },
   "events": {
    "type": "array",
    "items": {
     "type": "object",
     "required": [
      "kind"
     ],
     "properties": {
      "kind": {
       "type": "string",
       "maxLength": 64
      }
     }
    },
    "maxItems": 64,
    "description": "mode switches, pauses, failures before this step"
   },
   "decided": {
    "type": "array",
    "items": {
     "enum": [
      "token_budget",
      "prefill_tokens",
      "preempt",
      "admit"
     ]
    },
    "maxItems": 4,
    "description": "the hooks whose answers this step were a loaded policy's own, in the order first asked; empty for a built-in. A hook refused (its policy_error event) and everything after it was decided by the continuous defaults."
   },
   "expected_s": {
    "anyOf": [
     {
      "type": "number",
      "minimum": -1000000000000000.0,
      "maximum": 1000000000000000.0
     },
     {
      "type": "null"
     }
    ],
    "description": "the cost model's duration for this step's work on a quiet machine"
   },
   "rank": {
    "type": "integer",
    "minimum": 0,
    "maximum": 1024,
    "description": "an observed vLLM's data-parallel rank"
   },
   "vllm_step": {
    "type": "integer",
    "minimum": 0,
    "maximum": 1000000000000,
    "description": "that rank's own step count (observed vLLM only)"
   }
  },
  "required": [
   "step",
   "t_start",
   "t_end",
   "policy",
   "runner",
   "slots",
   "admitted",
   "finished",
   "preempted",
   "queue_len",
   "kv",
   "tokens",
   "spans",
   "events"
  ]
 }
};
})(typeof window !== "undefined" ? window : this);
