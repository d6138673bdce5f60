/**
 * What the kernel sends on the `klbr` comm (docs/comm-protocol.md), and the type guards that check a
 * message is what it claims before anything reads it: comm data arrives as JSON, typed by nobody.
 * No JupyterLab here.
 */

import type { JSONObject } from '@lumino/coreutils';

import { ICellsChunk, IMemory, IQueued, IRecordPart, IUnmatched } from './logic';

/** What the kernel says of itself (`hello`, the `state` pushes and the `restart` answer). */
export interface IKernelState {
  generation: number | null;
  placement: string;
  recording: 'recording' | 'paused' | 'unavailable';
  notebook: string | null;
  kernel_session: string;
  store_session: number | null;
  status: Array<[string, string]>;
  memory?: IMemory | null; // null (or absent, from an older kernel) until a worker here is sampled
  facts?: IFacts | null; // absent from an older kernel: the dialog then shows `status` as it is
}

/** What the status dialog says in a user's words, as data (`klbr_kernel/magics/status.py`'s `status_facts`). */
export interface IFacts {
  state: string;
  since: string | null; // when the serving generation started (ISO), null while none serves
  host: string | null;
  cell_log: string;
  cell_log_problem: string | null; // why it does not record now
  restarts: number;
  restart_limit: number;
  restart_window: number;
  cell_timeout: number | null;
  interrupt_grace: number;
  memory_limit_next: number | null; // what `%klbr memory` or the config set for the next generation
  memory_limit_applies: boolean | null; // whether the placement applies one (null: no generation)
}

/** An iopub output of a followed cell, pushed as its worker sent it. */
export interface IOutputPush {
  op: 'output';
  msg_id: string;
  msg_type: string;
  content: JSONObject;
}

/** A followed cell is answered: pushed once, after its last output. */
export interface IEndedPush {
  op: 'ended';
  msg_id: string;
  execution_count: number | null;
}

/** Why the kernel refused a request: `name` is the protocol's error name. */
export interface IRefusal {
  name: string;
  message: string;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isArrayOf<T>(value: unknown, item: (v: unknown) => v is T): value is T[] {
  return Array.isArray(value) && value.every(item);
}

function isString(value: unknown): value is string {
  return typeof value === 'string';
}

function isNumber(value: unknown): value is number {
  return typeof value === 'number';
}

function isStringOrNull(value: unknown): value is string | null {
  return value === null || typeof value === 'string';
}

function isNumberOrNull(value: unknown): value is number | null {
  return value === null || typeof value === 'number';
}

function isStatusRow(value: unknown): value is [string, string] {
  return Array.isArray(value) && value.length === 2 && value.every(isString);
}

function isMemory(value: unknown): value is IMemory {
  return isObject(value) && isNumber(value.rss) && isNumber(value.peak) && isNumberOrNull(value.limit);
}

export function isFacts(value: unknown): value is IFacts {
  return (
    isObject(value) &&
    isString(value.state) &&
    isStringOrNull(value.since) &&
    isStringOrNull(value.host) &&
    isString(value.cell_log) &&
    isStringOrNull(value.cell_log_problem) &&
    isNumber(value.restarts) &&
    isNumber(value.restart_limit) &&
    isNumber(value.restart_window) &&
    isNumberOrNull(value.cell_timeout) &&
    isNumber(value.interrupt_grace) &&
    isNumberOrNull(value.memory_limit_next) &&
    (value.memory_limit_applies === null || typeof value.memory_limit_applies === 'boolean')
  );
}

const RECORDING = new Set<unknown>(['recording', 'paused', 'unavailable']);

export function isKernelState(data: unknown): data is IKernelState {
  return (
    isObject(data) &&
    isNumberOrNull(data.generation) &&
    isString(data.placement) &&
    RECORDING.has(data.recording) &&
    isStringOrNull(data.notebook) &&
    isString(data.kernel_session) &&
    isNumberOrNull(data.store_session) &&
    isArrayOf(data.status, isStatusRow) &&
    (data.memory === undefined || data.memory === null || isMemory(data.memory)) &&
    (data.facts === undefined || data.facts === null || isFacts(data.facts))
  );
}

export function isOutputPush(data: unknown): data is IOutputPush {
  return isObject(data) && data.op === 'output' && isString(data.msg_id) && isString(data.msg_type) && isObject(data.content);
}

export function isEndedPush(data: unknown): data is IEndedPush {
  return isObject(data) && data.op === 'ended' && isString(data.msg_id) && isNumberOrNull(data.execution_count);
}

function isOutput(value: unknown): boolean {
  return isObject(value) && isString(value.output_type);
}

function isRecordPart(value: unknown): value is IRecordPart {
  return (
    isObject(value) &&
    isStringOrNull(value.cell_id) &&
    isNumber(value.record_id) &&
    isString(value.msg_id) &&
    isNumber(value.session) &&
    isNumberOrNull(value.execution_count) &&
    isString(value.status) &&
    typeof value.running === 'boolean' &&
    isString(value.code) &&
    typeof value.outputs_truncated === 'boolean' &&
    isNumber(value.part) &&
    typeof value.complete === 'boolean' &&
    Array.isArray(value.outputs) &&
    value.outputs.every(isOutput)
  );
}

function isUnmatched(value: unknown): value is IUnmatched {
  return (
    isObject(value) &&
    isNumber(value.record_id) &&
    isStringOrNull(value.cell_id) &&
    isNumberOrNull(value.execution_count) &&
    isString(value.status) &&
    isString(value.first_line)
  );
}

function isQueued(value: unknown): value is IQueued {
  return isObject(value) && isString(value.cell_id) && isString(value.msg_id) && isString(value.code);
}

function optional<T>(value: unknown, item: (v: unknown) => v is T): boolean {
  return value === undefined || isArrayOf(value, item);
}

export function isCellsChunk(data: unknown): data is ICellsChunk {
  return (
    isObject(data) &&
    isNumber(data.v) &&
    isString(data.id) &&
    data.op === 'cells' &&
    isNumber(data.chunk) &&
    typeof data.last === 'boolean' &&
    isArrayOf(data.cells, isRecordPart) &&
    (data.session === undefined || isNumberOrNull(data.session)) &&
    optional(data.unmatched, isUnmatched) &&
    optional(data.queued, isQueued) &&
    optional(data.following, isString)
  );
}

/** The refusal a message carries, or null when it carries none (a malformed one is named as such). */
export function refusal(data: JSONObject): IRefusal | null {
  const error = data.error;
  if (error === undefined) {
    return null;
  }
  if (isObject(error) && isString(error.name) && isString(error.message)) {
    return { name: error.name, message: error.message };
  }
  return { name: 'MalformedAnswer', message: 'an error without a name and a message' };
}
