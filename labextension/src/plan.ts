/**
 * The rebuild offer's decisions, with no JupyterLab: what the kernel's `plan` answer is (checked before
 * it is read), when a generation change is announced and when it offers `%klbr rebuild`, and which
 * cells show results that have no variables behind them any more (docs/comm-protocol.md, `plan`).
 */

/** The previous generation's plan, as `%klbr rebuild --plan` has it. */
export interface IRebuildPlan {
  generation: number;
  end_reason: string | null;
  asked: boolean; // it ended because the user (or a cell) asked: a restart, a move
  rebuilt: boolean; // the serving generation rebuilt it already
  cells: number; // how many a rebuild runs
  skipped: number;
  seconds: number; // what those took when they ran
  text: string;
}

/** Why klbr starts no generation until the user acts (a crash loop, a lost link): the error a cell gets meanwhile. */
export interface IRefusal {
  ename: string;
  evalue: string;
}

/** The `plan` answer: the serving generation, each cell's, the plan, and what refuses it. */
export interface IPlanAnswer {
  current: number | null;
  generations: Record<string, number>;
  plan: IRebuildPlan | null;
  refusal?: IRefusal | null; // absent from an older kernel: read as null
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isRebuildPlan(value: unknown): value is IRebuildPlan {
  return (
    isObject(value) &&
    typeof value.generation === 'number' &&
    (value.end_reason === null || typeof value.end_reason === 'string') &&
    typeof value.asked === 'boolean' &&
    typeof value.rebuilt === 'boolean' &&
    typeof value.cells === 'number' &&
    typeof value.skipped === 'number' &&
    typeof value.seconds === 'number' &&
    typeof value.text === 'string'
  );
}

function isRefusal(value: unknown): value is IRefusal {
  return isObject(value) && typeof value.ename === 'string' && typeof value.evalue === 'string';
}

export function isPlanAnswer(data: unknown): data is IPlanAnswer {
  return (
    isObject(data) &&
    (data.current === null || typeof data.current === 'number') &&
    isObject(data.generations) &&
    Object.values(data.generations).every(n => typeof n === 'number') &&
    (data.plan === null || isRebuildPlan(data.plan)) &&
    (data.refusal === undefined || data.refusal === null || isRefusal(data.refusal))
  );
}

/** How long, as a person reads an estimate: `under a second`, `about 12 s`, `about 3 min`. */
export function about(seconds: number): string {
  if (seconds < 1) {
    return 'under a second';
  }
  if (seconds < 60) {
    return `about ${Math.round(seconds)} s`;
  }
  if (seconds < 3600) {
    return `about ${Math.round(seconds / 60)} min`;
  }
  return `about ${(seconds / 3600).toFixed(1)} h`;
}

/** The offer's button: `Rebuild the namespace (14 cells, about 3 min)`. */
export function offerLabel(plan: IRebuildPlan): string {
  return `Rebuild the namespace (${plan.cells} cell${plan.cells === 1 ? '' : 's'}, ${about(plan.seconds)})`;
}

/** The plan a rebuild would run now, if there is one to offer: cells to run, of a generation that no longer serves, not
 * rebuilt yet, and klbr willing to start a generation for it (not in a crash loop, its link not lost). */
export function rebuildable(answer: IPlanAnswer): IRebuildPlan | null {
  const plan = answer.plan;
  const refused = answer.refusal !== undefined && answer.refusal !== null;
  return plan !== null && plan.cells > 0 && !plan.rebuilt && plan.generation !== answer.current && !refused ? plan : null;
}

/** A generation change seen in the kernel's state: the one before and the one now. */
export interface IGenerationChange {
  from: number;
  to: number;
}

/** Follows the serving generation through the kernel's states; a change is reported once. */
export class GenerationWatch {
  /** The state says `generation` serves (null: none yet); the change it makes, if any. */
  seen(generation: number | null): IGenerationChange | null {
    if (generation === null) {
      return null;
    }
    const last = this._last;
    this._last = generation;
    return last !== null && last !== generation ? { from: last, to: generation } : null;
  }

  /** Whether a generation was seen since the start (or the last `reset`). */
  get watching(): boolean {
    return this._last !== null;
  }

  /** The generation seen last (it may have ended since), if any. */
  get last(): number | null {
    return this._last;
  }

  /** Another kernel: what the last one served says nothing of it. */
  reset(): void {
    this._last = null;
  }

  private _last: number | null = null;
}

/** How the plan's generation ended, for a toast: ` (lost: killed by signal 9 (SIGKILL))`, or nothing when unknown. */
function how(answer: IPlanAnswer): string {
  return answer.plan !== null && answer.plan.end_reason ? ` (${answer.plan.end_reason})` : '';
}

/** What a generation change says, of the notebook `name`: which one ended, how (the plan read after it knows), and
 * that the new one starts empty. */
export function announcement(change: IGenerationChange, answer: IPlanAnswer, name: string): string {
  const ended = answer.plan !== null ? answer.plan.generation : change.from;
  return `klbr, ${name}: generation ${ended} ended${how(answer)}; generation ${change.to} starts with an empty namespace.`;
}

/** What the end of the last generation klbr starts says (a crash loop, a lost link): which one ended, how, and the
 * refusal's words for the user (the cell's error without its "Nothing ran: ", without the operator's line);
 * null while klbr is willing to start one. */
export function stopped(answer: IPlanAnswer, name: string): string | null {
  const refusal = answer.refusal;
  if (refusal === undefined || refusal === null || answer.current !== null) {
    return null;
  }
  const ended = answer.plan !== null ? `generation ${answer.plan.generation} ended${how(answer)}, and ` : '';
  return `klbr, ${name}: ${ended}no new generation starts (${refusal.ename}): ${userWords(refusal)}`;
}

/** What the plan dialog says when it has no plan to show: why no rebuild, in the refusal's words (what to do
 * included), or that there is nothing to rebuild. */
export function noRebuild(answer: IPlanAnswer | null, name: string): string {
  const refusal = answer?.refusal;
  if (refusal === undefined || refusal === null) {
    return `klbr, ${name}: there is nothing to rebuild`;
  }
  return `klbr, ${name}: no rebuild now (${refusal.ename}): ${userWords(refusal)}`;
}

/** A refusal's words for the user: the cell's error's first line, without its "Nothing ran: ". */
function userWords(refusal: IRefusal): string {
  return refusal.evalue.split('\n')[0].replace(/^Nothing ran: /, '');
}

/** Whether a change is offered a rebuild at once: the generation ended without anyone asking. */
export function offerOnChange(answer: IPlanAnswer): IRebuildPlan | null {
  const plan = rebuildable(answer);
  return plan !== null && !plan.asked ? plan : null;
}

/** The cells whose results were made in a generation that no longer serves: cell id to that generation. */
export function earlierCells(answer: IPlanAnswer): Map<string, number> {
  const earlier = new Map<string, number>();
  if (answer.current === null) {
    return earlier;
  }
  for (const [cellId, generation] of Object.entries(answer.generations)) {
    if (generation !== answer.current) {
      earlier.set(cellId, generation);
    }
  }
  return earlier;
}
